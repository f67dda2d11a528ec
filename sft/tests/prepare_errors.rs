//! Rows that cannot be prepared (a conversation without a chat template, a row over
//! max_length with truncation off, assistant-only loss without generation markers) give an
//! error naming the file and line, or a counted skip; never a silently wrong mask.

mod support;

use std::path::Path;

use dsplan_sft::{
    AssistantLoss, DatasetReader, HfTokenizer, OnBadRow, OverLength, PrepareSettings,
    prepare_dataset,
};

fn prepare(
    data: &Path,
    model: &Path,
    settings: PrepareSettings,
    on_bad_row: OnBadRow,
) -> Result<dsplan_sft::PreparedSet, String> {
    let tokenizer = HfTokenizer::from_dir(model).expect("tokenizer");
    let reader = DatasetReader::open(data, Default::default()).map_err(|e| e.to_string())?;
    prepare_dataset(reader, &tokenizer, &settings, on_bad_row).map_err(|e| e.to_string())
}

#[test]
fn long_rows_refused_with_their_line_or_skipped() {
    let Some(root) = support::reference() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("train.jsonl");
    std::fs::write(
        &data,
        "{\"text\": \"ab\"}\n{\"text\": \"a much longer text than that\"}\n",
    )
    .expect("write");
    let settings = PrepareSettings {
        max_length: Some(4),
        over_length: OverLength::Refuse,
        ..PrepareSettings::default()
    };
    let model = root.join("models/llama_bpe");
    let error = prepare(&data, &model, settings, OnBadRow::Stop).expect_err("too long");
    assert!(
        error.starts_with(&format!("{}:2: is ", data.display())),
        "{error}"
    );
    assert!(
        error.contains("more than max_length 4, and truncation is off"),
        "{error}"
    );
    let kept = prepare(&data, &model, settings, OnBadRow::Skip).expect("skips");
    assert_eq!((kept.rows.len(), kept.bad.count), (1, 1));
    let truncated = prepare(
        &data,
        &model,
        PrepareSettings {
            over_length: OverLength::KeepStart,
            ..settings
        },
        OnBadRow::Stop,
    )
    .expect("truncates");
    assert_eq!(truncated.rows[1].input_ids.len(), 4);
}

#[test]
fn conversations_need_a_template_and_assistant_masks_need_markers() {
    let Some(root) = support::reference() else {
        return;
    };
    let data = root.join("data/messages_eval.jsonl");
    let error = prepare(
        &data,
        &root.join("models/llama_bpe"),
        PrepareSettings::default(),
        OnBadRow::Stop,
    )
    .expect_err("no template");
    assert!(
        error.starts_with(&format!(
            "{}:1: the tokenizer has no chat template",
            data.display()
        )),
        "{error}"
    );

    let dir = tempfile::tempdir().expect("temp dir");
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(
            root.join("models/llama_sp").join(file),
            dir.path().join(file),
        )
        .expect("copy");
    }
    let plain =
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
    std::fs::write(dir.path().join("chat_template.jinja"), plain).expect("write");
    let assistant_only = PrepareSettings {
        assistant_loss: AssistantLoss::AssistantOnly,
        ..PrepareSettings::default()
    };
    let error = prepare(&data, dir.path(), assistant_only, OnBadRow::Stop).expect_err("no markers");
    assert!(
        error.contains(
            "tokenizer_config.json: assistant_only_loss needs a chat template with {% generation %}"
        ),
        "{error}"
    );
    let whole = prepare(
        &data,
        dir.path(),
        PrepareSettings::default(),
        OnBadRow::Stop,
    )
    .expect("renders");
    assert_eq!(whole.rows.len(), 20);

    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{{ raise_exception('only user turns, please') }}",
    )
    .expect("write");
    let error = prepare(
        &data,
        dir.path(),
        PrepareSettings::default(),
        OnBadRow::Stop,
    )
    .expect_err("raises");
    assert!(
        error.starts_with(&format!(
            "{}:1: the chat template failed: only user turns, please",
            data.display()
        )),
        "{error}"
    );
}
