//! Datasets read from JSONL, JSON arrays, Parquet and directories of shards; the shape
//! detected or forced; every kind of bad record an error naming file and line, or a counted
//! skip; an empty dataset refused.

mod support;

use std::path::Path;

use dsplan_sft::dataset::Sourced;
use dsplan_sft::{DatasetOptions, DatasetReader, Example, OnBadRow, Shape, ShapeChoice};

fn read(
    path: &Path,
    options: DatasetOptions,
) -> Result<(Vec<Sourced>, Option<Shape>, u64), String> {
    let mut reader = DatasetReader::open(path, options).map_err(|e| e.to_string())?;
    let examples = reader.read_all().map_err(|e| e.to_string())?;
    Ok((examples, reader.shape(), reader.bad_rows().count))
}

fn skip() -> DatasetOptions {
    DatasetOptions {
        on_bad_row: OnBadRow::Skip,
        ..DatasetOptions::default()
    }
}

#[test]
fn fixture_files_are_read_in_their_shapes() {
    let Some(dir) = support::reference() else {
        return;
    };
    for (file, shape, rows) in [
        ("text.jsonl", Shape::Text, 200),
        ("prompt_completion.jsonl", Shape::PromptCompletion, 150),
        ("messages.jsonl", Shape::Messages, 150),
        ("messages_eval.jsonl", Shape::Messages, 20),
    ] {
        let (examples, detected, bad) =
            read(&dir.join("data").join(file), DatasetOptions::default()).expect(file);
        assert_eq!(
            (examples.len(), detected, bad),
            (rows, Some(shape), 0),
            "{file}"
        );
        assert_eq!(examples.last().map(|e| e.row), Some(rows as u64 - 1));
    }
}

#[test]
fn a_json_array_and_a_directory_of_shards_read_in_order() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("b.jsonl"),
        "{\"text\": \"two\"}\n\n{\"text\": \"three\"}\n",
    )
    .expect("write");
    std::fs::write(dir.path().join("a.json"), "[{\"text\": \"one\"}]").expect("write");
    std::fs::write(dir.path().join(".hidden.jsonl"), "not json").expect("write");
    let (examples, shape, _) = read(dir.path(), DatasetOptions::default()).expect("reads");
    let texts: Vec<_> = examples
        .iter()
        .map(|e| match &e.example {
            Example::Text(text) => text.as_str(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(texts, ["one", "two", "three"]);
    assert_eq!(shape, Some(Shape::Text));
    assert_eq!(
        examples[2].location.to_string(),
        format!("{}:3", dir.path().join("b.jsonl").display())
    );
}

#[test]
fn bad_records_name_file_and_line_or_are_counted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = [
        (
            "{\"text\": \"ok\"}\n{\"text\": \"unterminated\n",
            ":2: is not valid JSON",
        ),
        (
            "{\"text\": \"ok\"}\n{\"body\": \"x\"}\n",
            ":2: has no field `text` (its fields: body)",
        ),
        (
            "{\"text\": \"ok\"}\n{\"text\": 5}\n",
            ":2: field `text` is a number, not a string",
        ),
        (
            "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}\n",
            ":2: messages[0].role is \"robot\", not one of",
        ),
        (
            "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n{\"messages\": [{\"role\": \"user\"}]}\n",
            ":2: messages[0] has no `content`",
        ),
        (
            "{\"prompt\": \"p\", \"completion\": \"c\"}\n[1, 2]\n",
            ":2: is an array, not a JSON object",
        ),
    ];
    for (at, (text, expected)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("case{at}.jsonl"));
        std::fs::write(&path, text).expect("write");
        let error = read(&path, DatasetOptions::default()).expect_err(text);
        assert!(
            error.contains(&format!("{}{expected}", path.display()))
                && error.contains("--on-bad-row skip"),
            "{error}"
        );
        let (examples, _, bad) = read(&path, skip()).expect("skips");
        assert_eq!((examples.len(), bad), (1, 1), "{text}");
    }
}

#[test]
fn forced_shape_and_empty_datasets() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("pc.jsonl");
    std::fs::write(
        &path,
        "{\"prompt\": \"p\", \"completion\": \"c\", \"text\": \"t\"}\n",
    )
    .expect("write");
    let forced = DatasetOptions {
        shape: ShapeChoice::Forced(Shape::Text),
        ..DatasetOptions::default()
    };
    let (examples, shape, _) = read(&path, forced).expect("reads");
    assert_eq!(shape, Some(Shape::Text));
    assert_eq!(examples[0].example, Example::Text("t".to_string()));

    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "\n  \n").expect("write");
    let error = read(&empty, DatasetOptions::default()).expect_err("empty");
    assert!(
        error.contains("empty.jsonl: holds no example: the dataset is empty"),
        "{error}"
    );

    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "nope\n{\"x\": 1}\n").expect("write");
    let error = read(&bad, skip()).expect_err("all bad");
    assert!(error.contains("all 2 records were bad"), "{error}");

    let other = dir.path().join("data.csv");
    std::fs::write(&other, "a,b\n").expect("write");
    let error = read(&other, DatasetOptions::default()).expect_err("csv");
    assert!(
        error.contains("is not a .jsonl, .json or .parquet file"),
        "{error}"
    );
}

/// A Parquet file of `prompt` / `completion` string columns (the low-level writer, no arrow).
fn write_parquet(path: &Path, rows: &[(&str, &str)]) {
    use parquet::data_type::{ByteArray, ByteArrayType};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;
    use std::sync::Arc;

    let schema = parse_message_type(
        "message rows { REQUIRED BYTE_ARRAY prompt (UTF8); REQUIRED BYTE_ARRAY completion (UTF8); }",
    )
    .expect("schema");
    let file = std::fs::File::create(path).expect("create");
    let properties = Arc::new(WriterProperties::builder().build());
    let mut writer = SerializedFileWriter::new(file, Arc::new(schema), properties).expect("writer");
    let mut group = writer.next_row_group().expect("row group");
    let mut column_index = 0;
    while let Some(mut column) = group.next_column().expect("column") {
        let values: Vec<ByteArray> = rows
            .iter()
            .map(|row| ByteArray::from(if column_index == 0 { row.0 } else { row.1 }))
            .collect();
        column
            .typed::<ByteArrayType>()
            .write_batch(&values, None, None)
            .expect("write");
        column.close().expect("close column");
        column_index += 1;
    }
    group.close().expect("close group");
    writer.close().expect("close file");
}

#[test]
fn parquet_rows_are_read_with_their_row_numbers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("train.parquet");
    write_parquet(&path, &[("Say hi.", " Hi."), ("Count.", " 1 2 3")]);
    let (examples, shape, _) = read(&path, DatasetOptions::default()).expect("reads");
    assert_eq!(shape, Some(Shape::PromptCompletion));
    assert_eq!(
        examples[1].example,
        Example::PromptCompletion {
            prompt: "Count.".to_string(),
            completion: " 1 2 3".to_string()
        }
    );
    assert_eq!(
        examples[1].location.to_string(),
        format!("{} row 2", path.display())
    );

    let broken = dir.path().join("broken.parquet");
    std::fs::write(&broken, b"PAR1 not really").expect("write");
    let error = read(&broken, DatasetOptions::default()).expect_err("broken");
    assert!(
        error.contains("broken.parquet: is not a readable Parquet file"),
        "{error}"
    );
}
