//! Behaviour of [`SourceFile::parse`] and locating, through the public API.

use super::*;
use crate::diagnostics::{Code, Severity};
use serde_json::json;

fn parse_ok(text: &str) -> (SourceFile, Vec<Diagnostic>) {
    SourceFile::parse_with_duplicates("ds_config.json", text.as_bytes()).expect("parses")
}

fn fatal(text: &str) -> Diagnostic {
    let mut errors = SourceFile::parse("ds_config.json", text.as_bytes()).expect_err("fatal error");
    assert_eq!(errors.len(), 1, "{errors:?}");
    errors.remove(0)
}

fn position(diagnostic: &Diagnostic) -> (usize, usize) {
    (
        diagnostic.line.expect("line"),
        diagnostic.column.expect("column"),
    )
}

const CONFIG: &str = r#"{
  "train_batch_size": 16,
  "zero_optimization": {
    "stage": 2,
    "overlap_com": true,
    "reduce_bucket_size": 5e8
  },
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999]}}
}
"#;

#[test]
fn a_strict_file_parses_without_diagnostics() {
    let (file, diagnostics) = parse_ok(CONFIG);
    assert!(diagnostics.is_empty(), "{diagnostics:?}");
    let expected: serde_json::Value = serde_json::from_str(CONFIG).expect("strict JSON");
    assert_eq!(file.value(), &expected);
    assert_eq!(file.path(), "ds_config.json");
    assert_eq!(file.text(), CONFIG);
}

#[test]
fn keeps_the_key_order_of_the_file() {
    let (file, _) = parse_ok(r#"{"z": 1, "a": 2, "m": 3}"#);
    let keys: Vec<&String> = file.value().as_object().expect("object").keys().collect();
    assert_eq!(keys, ["z", "a", "m"]);
}

#[test]
fn numbers_keep_their_literal_form() {
    let (file, _) = parse_ok(CONFIG);
    let bucket = file
        .value()
        .pointer("/zero_optimization/reduce_bucket_size")
        .expect("bucket");
    assert!(bucket.is_f64());
    assert_eq!(bucket.as_f64(), Some(5e8));
    assert!(file.value()["train_batch_size"].is_u64());
}

#[test]
fn every_key_and_value_has_its_span() {
    let (file, _) = parse_ok(CONFIG);
    let stage = file.span_of("/zero_optimization/stage").expect("stage");
    assert_eq!(stage.key.expect("key").slice(file.text()), "\"stage\"");
    assert_eq!(stage.value.slice(file.text()), "2");
    let betas = file.span_of("/optimizer/params/betas").expect("betas");
    assert_eq!(betas.value.slice(file.text()), "[0.9, 0.999]");
    let second = file.span_of("/optimizer/params/betas/1").expect("item");
    assert_eq!(second.key, None);
    assert_eq!(second.value.slice(file.text()), "0.999");
    let root = file.span_of("").expect("root");
    assert_eq!(root.value.slice(file.text()), CONFIG.trim_end());
    assert_eq!(file.span_of("/zero_optimization/missing"), None);
}

#[test]
fn locate_points_at_the_key_of_a_member_and_at_an_array_item() {
    let (file, _) = parse_ok(CONFIG);
    let mut unknown = Diagnostic::error(
        Code::UnknownKey,
        "/zero_optimization/overlap_com",
        "unknown key",
    );
    file.locate(&mut unknown);
    assert_eq!(position(&unknown), (5, 5));
    let mut item = Diagnostic::error(Code::OutOfRange, "/optimizer/params/betas/1", "x");
    file.locate(&mut item);
    let line = file.line_text(8).expect("line 8");
    let column = line.find("0.999").expect("item") + 1;
    assert_eq!(position(&item), (8, column));
}

#[test]
fn locate_uses_the_nearest_ancestor_of_a_missing_key() {
    let (file, _) = parse_ok(CONFIG);
    let mut missing = Diagnostic::error(Code::MissingKey, "/optimizer/params/eps", "x");
    file.locate(&mut missing);
    assert_eq!(position(&missing), (8, 34));
    assert_eq!(
        file.anchor_span("/optimizer/params/eps").slice(file.text()),
        "\"params\""
    );
    let mut top = Diagnostic::error(Code::BatchSizeMissing, "/gradient_accumulation_steps", "x");
    file.locate(&mut top);
    assert_eq!(position(&top), (1, 1));
}

#[test]
fn locate_keeps_a_position_already_set() {
    let (file, _) = parse_ok(CONFIG);
    let mut located = Diagnostic::warning(Code::NonStrictJson, "", "x").at(3, 7);
    file.locate(&mut located);
    assert_eq!(position(&located), (3, 7));
}

#[test]
fn lines_and_columns_through_the_file() {
    let (file, _) = parse_ok("{\r\n  \"é\": \"ü\"\r\n}");
    let value = file.span_of("/é").expect("member").value;
    assert_eq!(file.line_col(value.start), (2, 8));
    assert_eq!(file.line_text(2), Some("  \"é\": \"ü\""));
    assert_eq!(file.line_text(4), None);
    assert_eq!(
        file.line_span(3).map(|span| span.slice(file.text())),
        Some("}")
    );
}

#[test]
fn comments_and_trailing_commas_are_accepted_with_one_warning() {
    let text = "{\n  // batch\n  \"train_batch_size\": 8, # per step\n  \"betas\": [1, 2,],\n  /* end */\n}";
    let (file, diagnostics) = parse_ok(text);
    assert_eq!(
        file.value(),
        &json!({"train_batch_size": 8, "betas": [1, 2]})
    );
    assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
    let warning = &diagnostics[0];
    assert_eq!(warning.code, Code::NonStrictJson);
    assert_eq!(warning.severity, Severity::Warning);
    assert_eq!(
        warning.message,
        "the file is not strict JSON: it has 3 comments and 2 trailing commas"
    );
    assert_eq!(position(warning), (2, 3));
    assert_eq!(
        warning.help.as_deref(),
        Some(
            "DeepSpeed's loader accepts this, but the Hugging Face Trainer and accelerate read \
             the file with strict JSON and will reject it"
        )
    );
}

#[test]
fn a_trailing_comma_in_an_object_counts() {
    let (_, diagnostics) = parse_ok("{\"a\": {\"b\": 1,},}");
    assert_eq!(
        diagnostics[0].message,
        "the file is not strict JSON: it has 2 trailing commas"
    );
    assert_eq!(position(&diagnostics[0]), (1, 14));
}

#[test]
fn a_byte_order_mark_is_skipped_and_reported() {
    let (file, diagnostics) =
        SourceFile::parse("ds_config.json", b"\xEF\xBB\xBF{\"a\": 1}").expect("parses");
    assert_eq!(file.text(), "{\"a\": 1}");
    assert_eq!(file.span_of("/a").expect("a").value.start, 6);
    assert_eq!(
        diagnostics[0].message,
        "the file is not strict JSON: it has a byte-order mark"
    );
}

#[test]
fn duplicate_keys_keep_the_last_value_and_name_the_first_line() {
    let text = "{\n  \"stage\": 1,\n  \"x\": 0,\n  \"stage\": 2,\n  \"stage\": 3\n}";
    let (file, diagnostics) = parse_ok(text);
    assert_eq!(file.value(), &json!({"stage": 3, "x": 0}));
    let keys: Vec<&String> = file.value().as_object().expect("object").keys().collect();
    assert_eq!(keys, ["stage", "x"], "first position, like a Python dict");
    assert_eq!(diagnostics.len(), 2, "{diagnostics:?}");
    for (diagnostic, line) in diagnostics.iter().zip([4, 5]) {
        assert_eq!(diagnostic.code, Code::DuplicateKey);
        assert_eq!(diagnostic.severity, Severity::Error);
        assert_eq!(diagnostic.pointer, "/stage");
        assert_eq!(
            diagnostic.message,
            "duplicate key `stage` at the top level: first defined on line 2"
        );
        assert_eq!(position(diagnostic), (line, 3));
        assert!(
            diagnostic
                .help
                .as_deref()
                .unwrap_or("")
                .contains("DeepSpeed rejects")
        );
    }
    let kept = file.span_of("/stage").expect("stage");
    assert_eq!(kept.value.slice(file.text()), "3");
}

#[test]
fn parse_refuses_duplicate_keys_as_deepspeed_does() {
    let text = "{\"a\": 1, // note\n \"a\": 2, \"b\": {\"c\": 1, \"c\": 1}}";
    let errors = SourceFile::parse("ds_config.json", text.as_bytes()).expect_err("fatal");
    let codes: Vec<(Code, &str)> = errors
        .iter()
        .map(|d| (d.code, d.pointer.as_str()))
        .collect();
    assert_eq!(
        codes,
        [
            (Code::NonStrictJson, ""),
            (Code::DuplicateKey, "/a"),
            (Code::DuplicateKey, "/b/c")
        ]
    );
    assert_eq!(
        errors[2].message,
        "duplicate key `c` in `b`: first defined on line 2"
    );
    assert!(SourceFile::parse("ok.json", b"{\"a\": 1}").is_ok());
}

#[test]
fn a_repeated_object_replaces_the_positions_inside_it() {
    let text =
        r#"{"zero_optimization": {"stage": 1, "old": true}, "zero_optimization": {"stage": 3}}"#;
    let (file, diagnostics) = parse_ok(text);
    assert_eq!(diagnostics.len(), 1);
    assert_eq!(file.value(), &json!({"zero_optimization": {"stage": 3}}));
    assert_eq!(file.span_of("/zero_optimization/old"), None);
    let stage = file.span_of("/zero_optimization/stage").expect("stage");
    assert_eq!(stage.value.start, text.rfind('3').expect("3"));
}

#[test]
fn duplicates_inside_a_section_name_the_section() {
    let text = "{\"zero_optimization\": {\"stage\": 1, \"stage\": 2}}";
    let (_, diagnostics) = parse_ok(text);
    assert_eq!(diagnostics[0].pointer, "/zero_optimization/stage");
    assert_eq!(
        diagnostics[0].message,
        "duplicate key `stage` in `zero_optimization`: first defined on line 1"
    );
}

#[test]
fn empty_files_are_fatal() {
    for (text, message) in [
        ("", "the file is empty"),
        ("  \n\t", "the file holds only whitespace"),
        ("// nothing\n/* here */", "the file holds only comments"),
    ] {
        let error = fatal(text);
        assert_eq!(error.code, Code::EmptyFile);
        assert_eq!(error.message, message);
        assert_eq!(position(&error), (1, 1));
    }
}

#[test]
fn bytes_that_are_not_utf8_are_fatal() {
    let error = SourceFile::parse("x.json", b"{\"a\": \"\xFF\"}")
        .expect_err("fatal")
        .remove(0);
    assert_eq!(error.code, Code::NotUtf8);
    assert_eq!(position(&error), (1, 8));
}

#[test]
fn the_root_must_be_an_object() {
    let error = fatal("[1, 2]");
    assert_eq!(error.code, Code::RootNotObject);
    assert_eq!(
        error.message,
        "a DeepSpeed config must be a JSON object, but this file holds an array"
    );
    let error = fatal("\n\"train_batch_size\": 8,\n\"steps_per_print\": 1\n");
    assert_eq!(error.code, Code::RootNotObject);
    assert_eq!(position(&error), (2, 1));
    assert_eq!(
        error.help.as_deref(),
        Some("wrap the keys and values in `{` and `}`")
    );
    assert_eq!(fatal("42").code, Code::RootNotObject);
    assert_eq!(fatal("null").code, Code::RootNotObject);
    let error = fatal("<xml/>");
    assert_eq!(error.code, Code::SyntaxError);
    assert_eq!(
        error.message,
        "expected `{` at the start of the config, found `<`"
    );
}

#[test]
fn a_missing_comma_is_reported_where_the_comma_belongs() {
    let text = "{\n  \"zero_optimization\": {\n    \"stage\": 3\n    \"offload_param\": {}\n  }\n}";
    let error = fatal(text);
    assert_eq!(error.code, Code::SyntaxError);
    assert_eq!(
        error.message,
        "expected `,` or `}` after the value of `stage`, found `\"offload_param\"`"
    );
    assert_eq!(error.help.as_deref(), Some("add a comma here"));
    assert_eq!(position(&error), (3, 15));
    assert_eq!(error.pointer, "/zero_optimization/stage");
}

#[test]
fn a_missing_comma_in_an_array_names_the_array() {
    let error = fatal("{\"betas\": [0.9\n 0.999]}");
    assert_eq!(
        error.message,
        "expected `,` or `]` after item 0 of `betas`, found `0.999`"
    );
    assert_eq!(position(&error), (1, 15));
    assert_eq!(error.pointer, "/betas/0");
}

#[test]
fn syntax_errors_say_what_was_expected_and_found() {
    type Case<'a> = (&'a str, &'a str, (usize, usize), Option<&'a str>);
    let cases: &[Case] = &[
        (
            "{\"stage\" 3}",
            "expected `:` after the key `stage`, found `3`",
            (1, 10),
            Some("separate a key from its value with `:`"),
        ),
        (
            "{\"stage\" = 3}",
            "expected `:` after the key `stage`, found `=`",
            (1, 10),
            Some("use `:` instead of `=`"),
        ),
        (
            "{stage: 3}",
            "expected a key in double quotes, found `stage`",
            (1, 2),
            None,
        ),
        (
            "{'stage': 3}",
            "expected a key in double quotes, found `'`",
            (1, 2),
            Some("JSON strings use double quotes `\"`, not single quotes"),
        ),
        (
            "{\u{201C}stage\u{201D}: 3}",
            "expected a key in double quotes, found `\u{201C}`",
            (1, 2),
            Some("`\u{201C}` is a typographic quote: JSON needs a plain `\"`"),
        ),
        (
            "{\"a\": }",
            "expected a value for `a`, found `}`",
            (1, 7),
            Some("a value is missing before it"),
        ),
        (
            "{\"a\": 1,, \"b\": 2}",
            "expected a key, found `,`",
            (1, 9),
            Some("remove the extra comma"),
        ),
        (
            "{\"fp16\": {\"enabled\": True}}",
            "expected a value for `enabled`, found `True`",
            (1, 22),
            Some("JSON booleans are lowercase: `true`"),
        ),
        (
            "{\"device\": cpu}",
            "expected a value for `device`, found `cpu`",
            (1, 12),
            Some("put text in double quotes: `\"cpu\"`"),
        ),
        (
            "{\"lr\": .5}",
            "expected a value for `lr`, found `.5`",
            (1, 8),
            Some("write the leading zero: `0.5`"),
        ),
        (
            "{\"a\": [1, 2}",
            "expected `,` or `]` after item 1 of `a`, found `}`",
            (1, 12),
            Some("the array opened on line 1 must be closed with `]`"),
        ),
        (
            "{\n  \"a\": {\"b\": 1\n",
            "expected `,` or `}` after the value of `b`, found the end of the file",
            (3, 1),
            Some("the object opened on line 2 is never closed: add `}`"),
        ),
        (
            "{\"a\": 1}\n}",
            "expected the end of the file after the top-level object, found `}`",
            (2, 1),
            None,
        ),
        (
            "{\"a\": \"x\n\"}",
            "this string is not closed before the end of the line",
            (1, 7),
            None,
        ),
        (
            "{\"path\": \"C:\\data\"}",
            "invalid escape `\\d` in a string",
            (1, 13),
            None,
        ),
        (
            "{\"a\": 1} /* open",
            "this `/*` comment is never closed",
            (1, 10),
            Some("close the comment with `*/`"),
        ),
        (
            "{\"a\": -}",
            "expected a digit after `-`, found `}`",
            (1, 8),
            None,
        ),
        (
            "{\"a\": 007}",
            "JSON numbers cannot have a leading zero: `007`",
            (1, 7),
            None,
        ),
    ];
    for (text, message, at, help) in cases {
        let error = fatal(text);
        assert_eq!(error.code, Code::SyntaxError, "{text}");
        assert_eq!(&error.message, message, "{text}");
        assert_eq!(position(&error), *at, "{text}: {message}");
        if let Some(help) = help {
            assert_eq!(error.help.as_deref(), Some(*help), "{text}");
        }
        assert!(
            error.help.is_some(),
            "every syntax error has a help: {text}"
        );
    }
}

#[test]
fn syntax_errors_carry_the_pointer_being_read() {
    assert_eq!(fatal("{\"a\": {\"b\": [1, x]}}").pointer, "/a/b/1");
    assert_eq!(fatal("{\"a/b\": {\"c~d\": tru}}").pointer, "/a~1b/c~0d");
    assert_eq!(fatal("{\"a\": 1, x}").pointer, "");
}

#[test]
fn numbers_beyond_f64_are_fatal_at_their_position() {
    let error = fatal("{\n  \"lr\": 1e400\n}");
    assert_eq!(error.code, Code::NumberOutOfRange);
    assert_eq!(position(&error), (2, 9));
    assert_eq!(error.pointer, "/lr");
}

#[test]
fn nesting_is_limited_before_recursing() {
    let nested = |levels: usize| {
        let inner = levels - 1;
        format!("{{\"a\": {}1{}}}", "[".repeat(inner), "]".repeat(inner))
    };
    let (file, _) = parse_ok(&nested(MAX_DEPTH));
    assert!(file.value()["a"].is_array());
    let error = fatal(&nested(MAX_DEPTH + 1));
    assert_eq!(error.code, Code::TooDeep);
    assert_eq!(position(&error), (1, 7 + MAX_DEPTH - 1));
    assert!(error.message.contains("128 levels"), "{}", error.message);
}

#[test]
fn the_deepest_value_is_still_located() {
    let levels = MAX_DEPTH - 1;
    let text = format!(
        "{{{}\"x\": 1{}}}",
        "\"a\": {".repeat(levels - 1),
        "}".repeat(levels - 1)
    );
    let (file, _) = parse_ok(&text);
    let pointer = format!("{}/x", "/a".repeat(levels - 1));
    assert_eq!(
        file.span_of(&pointer)
            .expect("deep")
            .value
            .slice(file.text()),
        "1"
    );
}
