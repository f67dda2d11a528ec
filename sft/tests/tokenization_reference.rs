//! Token ids equal the Python tokenizer's (transformers 5.23 `AutoTokenizer`) for every held
//! text of `tokenization.json`, with and without special tokens, and through the chat template
//! (rendered text, ids and assistant masks). Skips without `../shared`.

mod support;

use dsplan_sft::{AddSpecial, HfTokenizer};
use serde_json::Value;

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| v.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn held_texts_tokenize_as_in_python() {
    let Some(dir) = support::reference() else {
        return;
    };
    let table = support::json(&dir.join("tokenization.json"));
    let mut checked = 0;
    for (name, entry) in table["tokenizers"].as_object().expect("tokenizers") {
        let model = dir.join(entry["model_dir"].as_str().expect("model_dir"));
        let tokenizer = HfTokenizer::from_dir(&model).expect("tokenizer loads");
        assert_eq!(
            tokenizer.len() as u64,
            entry["len_tokenizer"].as_u64().expect("len_tokenizer"),
            "{name}"
        );
        let special = tokenizer.special();
        assert_eq!(
            special.bos.as_ref().map(|t| u64::from(t.id)),
            entry["bos_token_id"].as_u64()
        );
        assert_eq!(
            special.eos.as_ref().map(|t| u64::from(t.id)),
            entry["eos_token_id"].as_u64()
        );
        assert_eq!(
            special.pad.as_ref().map(|t| u64::from(t.id)),
            entry["pad_token_id"].as_u64()
        );
        for case in entry["cases"].as_array().expect("cases") {
            let text = case["text"].as_str().expect("text");
            let with = tokenizer.encode(text, AddSpecial::Yes).expect("encodes");
            let without = tokenizer.encode(text, AddSpecial::No).expect("encodes");
            assert_eq!(
                with,
                ids(&case["ids_with_special"]),
                "{name}: {text:?} with special"
            );
            assert_eq!(
                without,
                ids(&case["ids_without_special"]),
                "{name}: {text:?}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 60);
}

#[test]
fn chat_template_renders_and_masks_as_in_python() {
    let Some(dir) = support::reference() else {
        return;
    };
    let table = support::json(&dir.join("tokenization.json"));
    let cases = table["chat_template_cases"].as_array().expect("cases");
    for case in cases {
        let model = &table["tokenizers"][case["tokenizer"].as_str().expect("name")]["model_dir"];
        let tokenizer =
            HfTokenizer::from_dir(&dir.join(model.as_str().expect("dir"))).expect("loads");
        let prompt = case["add_generation_prompt"].as_bool().expect("flag");
        let chat = tokenizer
            .apply_chat_template(&case["messages"], prompt)
            .expect("renders");
        assert_eq!(chat.text, case["rendered"].as_str().expect("rendered"));
        assert_eq!(chat.ids, ids(&case["input_ids"]));
        if let Some(masks) = case.get("assistant_masks") {
            let expected: Vec<bool> = masks
                .as_array()
                .expect("mask")
                .iter()
                .map(|m| m.as_u64() == Some(1))
                .collect();
            assert_eq!(chat.assistant_mask, expected, "{}", chat.text);
            assert!(expected.iter().any(|&m| m), "the case marks something");
        }
    }
    assert_eq!(cases.len(), 12);
}
