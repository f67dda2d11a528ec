//! `dsplan validate`: schema checks and DeepSpeed's semantic rules, all problems at once.
//!
//! Validation runs in layers over the parsed document: the reader's own findings (duplicate
//! keys, comments), the structural walk against the generated JSON Schema ([`structure`]), the
//! batch-size triangle ([`batch`]) and the semantic rules ([`rules`]). Every layer returns
//! diagnostics; none stops the others, so a user sees every problem in one run.

pub mod batch;
pub mod rules;
pub mod structure;
pub mod suggest;
pub mod view;

use std::sync::OnceLock;

use serde_json::Value;

use crate::diagnostics::{Code, Diagnostic};
use crate::source::SourceFile;
use view::View;

/// What validation needs to know beyond the file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ValidateOptions {
    /// The data-parallel world size, when known: enables the exact batch-triangle check.
    pub world_size: Option<u64>,
}

/// The generated schema, built once per process.
fn schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(crate::config::schema)
}

/// Read and check one file. `Ok`: the parsed file and every diagnostic, located and in
/// source order. `Err`: the file could not be read as JSON at all (one located diagnostic).
pub fn validate_source(
    path: &str,
    bytes: &[u8],
    options: ValidateOptions,
) -> Result<(SourceFile, Vec<Diagnostic>), Vec<Diagnostic>> {
    let (file, mut found) = SourceFile::parse_with_duplicates(path, bytes)?;
    found.extend(validate_document(file.value(), options));
    file.locate_all(&mut found);
    found.sort_by_key(|d| (d.line.unwrap_or(0), d.column.unwrap_or(0)));
    crate::capped::cap_each_kind(&mut found);
    Ok((file, found))
}

/// Every problem in a parsed document.
pub fn validate_document(document: &Value, options: ValidateOptions) -> Vec<Diagnostic> {
    let view = View::new(document);
    let mut found = structure::check(document, schema());
    let removed: Vec<Diagnostic> = rules::keys::check(document);
    // A removed key is reported once, as removed, not also by the schema's `false`.
    found.retain(|d| {
        !removed
            .iter()
            .any(|r| r.code == Code::RemovedFeature && r.pointer == d.pointer)
    });
    found.extend(removed);
    // A short-name stage-3 "auto" is DeepSpeed's default with a warning, as `resolve` says.
    let aliased: Vec<Diagnostic> = crate::resolve::defaults::alias_autos(document)
        .into_iter()
        .map(|(_, warning)| warning)
        .collect();
    found.retain(|d| {
        !(d.code == Code::AutoNotAllowed && aliased.iter().any(|w| w.pointer == d.pointer))
    });
    found.extend(aliased);
    // A quoted number where the Trainer compares numbers: read as the number with a warning,
    // as `resolve` and `run` read it.
    let quoted = crate::resolve::normalise::quoted_numbers(document);
    found.retain(|d| !(d.code == Code::WrongType && quoted.iter().any(|q| q.pointer == d.pointer)));
    found.extend(quoted);
    found.extend(batch::check(document, options.world_size));
    found.extend(rules::precision::check(view));
    found.extend(rules::zero::check(view));
    found.extend(rules::optimizer::check(view));
    found.extend(rules::ranges::check(view));
    crate::capped::cap_each_kind(&mut found);
    found
}
