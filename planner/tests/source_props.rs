//! Properties of the config reader (`dsplan_planner::source`): it never panics, it reads back
//! exactly what serde_json writes, every value's span holds that value's text, and large or
//! hostile inputs take linear time.

use dsplan_planner::Code;
use dsplan_planner::json_pointer;
use dsplan_planner::source::SourceFile;
use proptest::prelude::*;
use serde_json::{Number, Value};
use std::time::{Duration, Instant};

// ----- strategies ---------------------------------------------------------------------------

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        (-1e6f64..1e6).prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        any::<String>().prop_map(Value::String),
        "[a-z_]{0,12}".prop_map(Value::String),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![any::<String>(), "[a-z_/~]{0,10}"]
}

fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(6, 96, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..8)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}

/// Any value, wrapped so the document root is an object.
fn document() -> impl Strategy<Value = Value> {
    prop_oneof![
        json_value().prop_map(|value| serde_json::json!({ "v": value })),
        prop::collection::vec((key(), json_value()), 0..6)
            .prop_map(|members| Value::Object(members.into_iter().collect())),
    ]
}

/// Text made of JSON-ish fragments, to reach deep into the parser's error paths.
fn jsonish_text() -> impl Strategy<Value = String> {
    let fragments = prop::sample::select(vec![
        "{", "}", "[", "]", ",", ":", "\"a\"", "\"k\":", "\"\\u", "\\ud83d", "\\n", "1", "-", "e",
        ".", "0", "9e999", "true", "nul", "//", "/*", "*/", "#", "\n", " ", "\"", "\\", "é",
        "\u{0}", "\r\n", "\t", "'",
    ]);
    prop::collection::vec(fragments, 0..64).prop_map(|parts| parts.concat())
}

/// The same pretty-printed JSON with a trailing comma before every closing bracket that ends
/// a non-empty container and a comment at the end of every line but the last (pretty output
/// never breaks a line inside a string).
fn lenient_copy(strict: &str) -> String {
    let lines: Vec<&str> = strict.lines().collect();
    let mut out = String::new();
    for (index, line) in lines.iter().enumerate() {
        out.push_str(line);
        let Some(next) = lines.get(index + 1) else {
            break;
        };
        let closes = next.trim_start().starts_with(['}', ']']);
        let opens = line.ends_with(['{', '[']);
        if closes && !opens {
            out.push(',');
        }
        out.push_str(" // note\n");
    }
    out
}

// ----- invariants ---------------------------------------------------------------------------

/// Every pointer of `value`, root first.
fn pointers(value: &Value, base: &str, out: &mut Vec<String>) {
    out.push(base.to_owned());
    match value {
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                pointers(item, &json_pointer::index(base, index), out);
            }
        }
        Value::Object(members) => {
            for (key, member) in members {
                pointers(member, &json_pointer::child(base, key), out);
            }
        }
        _ => {}
    }
}

/// The value the text of one span holds: read by serde_json when the file is strict JSON, else
/// by dsplan itself as the value of a one-member object.
fn reparse(slice: &str, strict: bool) -> Result<Value, String> {
    if strict {
        return serde_json::from_str(slice).map_err(|e| e.to_string());
    }
    let wrapped = format!("{{\"v\": {slice}}}");
    let (file, _) = SourceFile::parse("slice.json", wrapped.as_bytes())
        .map_err(|errors| format!("{errors:?}"))?;
    Ok(file.value()["v"].clone())
}

/// Every value of a parsed file has a span whose text is that value, and every member a key
/// span whose text is that key.
fn check_spans(file: &SourceFile) -> Result<(), TestCaseError> {
    // Floats: compare serde_json's reading of a slice with serde_json's reading of the whole
    // text, so a last-bit difference between two float parsers cannot fail the test.
    let (reference, strict) = match serde_json::from_str::<Value>(file.text()) {
        Ok(value) => (value, true),
        Err(_) => (file.value().clone(), false),
    };
    let mut all = Vec::new();
    pointers(file.value(), "", &mut all);
    for pointer in all {
        let located = file.span_of(&pointer);
        prop_assert!(located.is_some(), "no span for {pointer:?}");
        let Some(located) = located else { continue };
        let slice = located.value.slice(file.text());
        let reparsed = reparse(slice, strict)
            .map_err(|e| TestCaseError::fail(format!("{pointer:?}: {slice:?}: {e}")))?;
        prop_assert_eq!(
            Some(&reparsed),
            reference.pointer(&pointer),
            "at {:?}",
            pointer
        );
        match located.key {
            Some(key) => {
                let key_text: String = serde_json::from_str(key.slice(file.text()))
                    .map_err(|e| TestCaseError::fail(format!("key of {pointer:?}: {e}")))?;
                prop_assert_eq!(key_text, json_pointer::last_token(&pointer));
            }
            None => {
                let parent = file.value().pointer(json_pointer::parent(&pointer));
                prop_assert!(pointer.is_empty() || parent.is_some_and(Value::is_array));
            }
        }
    }
    Ok(())
}

/// Whatever the input, the outcome is well formed: a located fatal error, or a document whose
/// spans all hold.
fn check_outcome(bytes: &[u8]) -> Result<(), TestCaseError> {
    match SourceFile::parse_with_duplicates("fuzz.json", bytes) {
        Ok((file, diagnostics)) => {
            prop_assert!(file.value().is_object());
            for diagnostic in &diagnostics {
                prop_assert!(diagnostic.line.is_some() && diagnostic.column.is_some());
                prop_assert!(matches!(
                    diagnostic.code,
                    Code::DuplicateKey | Code::NonStrictJson
                ));
            }
            check_spans(&file)?;
        }
        Err(errors) => {
            prop_assert_eq!(errors.len(), 1);
            let error = &errors[0];
            prop_assert!(error.is_error());
            let line = error.line.unwrap_or(0);
            prop_assert!(line >= 1 && line <= bytes.split(|&b| b == b'\n').count());
            prop_assert!(error.column.is_some_and(|column| column >= 1));
            prop_assert!(!error.message.is_empty());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        check_outcome(&bytes)?;
    }

    #[test]
    fn jsonish_text_never_panics(text in jsonish_text()) {
        check_outcome(text.as_bytes())?;
        check_outcome(format!("{{\"a\": {text}").as_bytes())?;
    }

    #[test]
    fn mangled_json_never_panics(
        value in document(),
        cut in any::<prop::sample::Index>(),
        junk in prop::collection::vec(any::<u8>(), 0..4),
    ) {
        let text = serde_json::to_string_pretty(&value).expect("serialises");
        let at = cut.index(text.len() + 1);
        let mut bytes = text.into_bytes();
        bytes.splice(at..at, junk);
        check_outcome(&bytes)?;
        bytes.truncate(at);
        check_outcome(&bytes)?;
    }

    #[test]
    fn serde_json_output_reads_back_equal(value in document()) {
        for text in [
            serde_json::to_string(&value).expect("serialises"),
            serde_json::to_string_pretty(&value).expect("serialises"),
        ] {
            let (file, diagnostics) = SourceFile::parse("p.json", text.as_bytes())
                .map_err(|e| TestCaseError::fail(format!("{e:?} in {text}")))?;
            prop_assert!(diagnostics.is_empty(), "{:?}", diagnostics);
            // Exact equality: floats are read correctly rounded, so the shortest
            // representation serde_json writes comes back as the same f64.
            prop_assert_eq!(file.value(), &value);
            check_spans(&file)?;
        }
    }

    #[test]
    fn comments_and_trailing_commas_change_nothing_but_a_warning(value in document()) {
        let strict = serde_json::to_string_pretty(&value).expect("serialises");
        let lenient = lenient_copy(&strict);
        let (file, diagnostics) = SourceFile::parse("p.json", lenient.as_bytes())
            .map_err(|e| TestCaseError::fail(format!("{e:?} in {lenient}")))?;
        prop_assert_eq!(file.value(), &value);
        let warnings: Vec<_> = diagnostics.iter().filter(|d| d.code == Code::NonStrictJson).collect();
        prop_assert_eq!(warnings.len(), usize::from(lenient != strict));
        check_spans(&file)?;
    }
}

// ----- size and time ------------------------------------------------------------------------

const FIVE_MB: usize = 5 * 1024 * 1024;

/// Generous: the point is "linear, not quadratic" on a loaded 2-core CI machine in a debug
/// build; the measured times are printed.
const LIMIT: Duration = Duration::from_secs(30);

fn timed(
    label: &str,
    text: &str,
) -> Result<(SourceFile, Vec<dsplan_planner::Diagnostic>), Vec<dsplan_planner::Diagnostic>> {
    let start = Instant::now();
    let outcome = SourceFile::parse("big.json", text.as_bytes());
    let elapsed = start.elapsed();
    eprintln!("{label}: {} bytes in {elapsed:?}", text.len());
    assert!(elapsed < LIMIT, "{label} took {elapsed:?}");
    outcome
}

fn fatal_code(
    outcome: Result<(SourceFile, Vec<dsplan_planner::Diagnostic>), Vec<dsplan_planner::Diagnostic>>,
) -> Code {
    outcome.expect_err("fatal")[0].code
}

#[test]
fn five_megabytes_of_open_brackets_stop_at_the_depth_limit() {
    let brackets = "[".repeat(FIVE_MB);
    assert_eq!(
        fatal_code(timed("[[[[ as root", &brackets)),
        Code::RootNotObject
    );
    let inside = format!("{{\"a\": {brackets}");
    assert_eq!(fatal_code(timed("{\"a\": [[[[", &inside)), Code::TooDeep);
    let objects = "{\"a\":".repeat(FIVE_MB / 5);
    assert_eq!(fatal_code(timed("{\"a\":{\"a\":", &objects)), Code::TooDeep);
}

#[test]
fn a_five_megabyte_flat_object_parses_in_linear_time() {
    let mut text = String::with_capacity(FIVE_MB + 64);
    text.push('{');
    let mut count = 0usize;
    while text.len() < FIVE_MB {
        text.push_str(&format!("\"key_{count:09}\": {count},\n"));
        count += 1;
    }
    text.push_str("\"last\": 0}");
    let (file, diagnostics) = timed("flat object", &text).expect("parses");
    assert!(diagnostics.is_empty());
    assert_eq!(file.value().as_object().map(|m| m.len()), Some(count + 1));
    let middle = format!("/key_{:09}", count / 2);
    let located = file.span_of(&middle).expect("member");
    assert_eq!(located.value.slice(file.text()), (count / 2).to_string());
}

#[test]
fn other_five_megabyte_shapes_parse_in_linear_time() {
    let items = format!("{{\"a\": [{}0]}}", "0,".repeat(FIVE_MB / 2));
    let (file, _) = timed("array of 2.6M numbers", &items).expect("parses");
    assert_eq!(
        file.value()["a"].as_array().map(Vec::len),
        Some(FIVE_MB / 2 + 1)
    );

    let string = format!("{{\"a\": \"{}\"}}", "x\\n".repeat(FIVE_MB / 3));
    assert!(timed("one long string", &string).is_ok());

    let comments = format!("{}{{}}", "// comment\n".repeat(FIVE_MB / 11));
    let (_, diagnostics) = timed("comments", &comments).expect("parses");
    assert_eq!(diagnostics.len(), 1);

    let repeated = format!("{{{}\"k\": 0}}", "\"k\": 0,\n".repeat(FIVE_MB / 9));
    let diagnostics = timed("one key repeated", &repeated).expect_err("duplicates are fatal");
    // Capped (dsplan_planner::capped): the first 50, then one that counts the rest.
    let cap = dsplan_planner::capped::PER_KIND;
    assert_eq!(diagnostics.len(), cap + 1);
    assert!(
        diagnostics[cap].message.starts_with(&format!(
            "and {} more duplicate-key error(s)",
            FIVE_MB / 9 - cap
        )),
        "{}",
        diagnostics[cap].message
    );

    let unterminated = format!("{{\"a\": \"{}", "x".repeat(FIVE_MB));
    assert_eq!(
        fatal_code(timed("unterminated string", &unterminated)),
        Code::SyntaxError
    );
}

// ----- the corpus of real configs ------------------------------------------------------------

/// `../shared` next to the workspace root, when present.
fn shared_dir() -> Option<std::path::PathBuf> {
    let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared"));
    if dir.is_dir() {
        Some(dir.to_path_buf())
    } else {
        eprintln!("skipping: ../shared not found");
        None
    }
}

/// Every real config DeepSpeed accepts parses; exactly those that strict JSON rejects get the
/// non-strict warning (verdicts of hjson and `json.loads` recorded in
/// `reference/config_parse.json`); strict ones read back as serde_json reads them.
#[test]
fn real_configs_get_deepspeeds_and_strict_jsons_verdicts() {
    let Some(shared) = shared_dir() else { return };
    let reference: Value = serde_json::from_slice(
        &std::fs::read(shared.join("reference/config_parse.json")).expect("reference"),
    )
    .expect("reference JSON");
    let files = reference["files"].as_array().expect("files");
    assert!(files.len() > 50, "corpus too small: {}", files.len());
    for record in files {
        let name = record["file"].as_str().expect("file name");
        let bytes = std::fs::read(shared.join("corpus/ds_configs").join(name)).expect("config");
        let hjson_ok = record["hjson"]["ok"].as_bool().expect("hjson verdict");
        let strict_ok = record["strict_json"]["ok"]
            .as_bool()
            .expect("strict verdict");
        let outcome = SourceFile::parse(name, &bytes);
        assert_eq!(outcome.is_ok(), hjson_ok, "{name}: {outcome:?}");
        let Ok((file, diagnostics)) = outcome else {
            continue;
        };
        let non_strict = diagnostics.iter().any(|d| d.code == Code::NonStrictJson);
        assert_eq!(non_strict, !strict_ok, "{name}: {diagnostics:?}");
        if strict_ok {
            let expected: Value = serde_json::from_slice(&bytes).expect("strict JSON");
            assert_eq!(file.value(), &expected, "{name}");
        }
    }
}
