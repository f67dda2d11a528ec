//! `dsplan validate`: schema checks and DeepSpeed's semantic rules, all problems at once.
//!
//! Validation runs in layers over the parsed document: the structural walk against the
//! generated JSON Schema ([`structure`]), the batch-size triangle ([`batch`]) and the semantic
//! rules ([`rules`]). Every layer returns diagnostics; none stops the others, so a user sees
//! every problem in one run.

pub mod batch;
pub mod rules;
pub mod structure;
pub mod suggest;
pub mod view;

use serde_json::Value;

use crate::diagnostics::Diagnostic;
use view::View;

/// What validation needs to know beyond the file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ValidateOptions {
    /// The data-parallel world size, when known: enables the exact batch-triangle check.
    pub world_size: Option<u64>,
}

/// Every problem in `document` against `schema`, in document order within each layer.
pub fn validate_document(
    document: &Value,
    schema: &Value,
    options: ValidateOptions,
) -> Vec<Diagnostic> {
    let view = View::new(document);
    let mut found = structure::check(document, schema);
    found.extend(batch::check(document, options.world_size));
    found.extend(rules::precision::check(view));
    found.extend(rules::zero::check(view));
    found
}
