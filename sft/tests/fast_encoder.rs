//! The fast encoder gives every id the `tokenizers` crate gives (the crate is the oracle), on
//! a large varied corpus: the fixtures' texts and data, and texts built from them with a seeded
//! generator (shuffled and cut words, unicode scripts, digit runs, whitespace of every kind,
//! line breaks, contractions in both cases, emoji, `▁`, added tokens inside words), with and
//! without special tokens. Checked for the two fixture tokenizers and for variants of them
//! that take the other supported shapes (Llama 3's, Qwen 2's and GPT-2's `Split` patterns,
//! `add_prefix_space`, a post-processor `Sequence`, Metaspace with `split` and other
//! `prepend_scheme`s, a normalized added token); shapes it does not take are refused with the
//! reason and keep the crate's ids. The per-thread word cache changes nothing: ids with it
//! (misses, then all hits on a second pass) equal ids without it. Offsets (Metaspace) equal
//! the crate's too, and so do the chat template's ids and assistant masks. Skips without
//! `../shared`.

mod support;

use std::path::{Path, PathBuf};

use dsplan_sft::{AddSpecial, EncodePath, HfTokenizer};
use serde_json::{Value, json};

const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// splitmix64: a seeded generator, so that a failure repeats.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Fragments a generated text is made of, besides the fixtures' words.
const FRAGMENTS: &[&str] = &[
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    " \n ",
    "\u{a0}",
    "\u{3000}",
    "\u{2003}",
    "\u{0b}",
    "\u{0c}",
    "\u{85}",
    "\u{1c}",
    "\u{200b}",
    "\u{feff}",
    "\u{2028}",
    "'s",
    "'S",
    "'re",
    "'RE",
    "'Re",
    "'ve",
    "'LL",
    "'ll",
    "'d",
    "'D",
    "'m",
    "'t",
    "'ſ",
    "'x",
    "'",
    "''",
    "don't",
    "I'M",
    "we'Ve",
    "0",
    "7",
    "12",
    "123",
    "1234",
    "1234567",
    "3.14159",
    "٣٤٥",
    "½",
    "Ⅻ",
    "①",
    "é",
    "e\u{301}",
    "ß",
    "ſ",
    "K",
    "naïve",
    "café",
    "—",
    "“quotes”",
    "‘x’",
    "中文字符",
    "日本語",
    "한국어",
    "Ελληνικά",
    "русский",
    "עברית",
    "العربية",
    "हिन्दी",
    "ไทย",
    "😀",
    "👍🏽",
    "🇫🇷",
    "👨\u{200d}👩\u{200d}👧",
    "𝔘𝔫𝔦",
    "𐍈",
    "\u{10ffff}",
    "▁",
    "▁▁",
    "a▁b",
    "!",
    "?!",
    "...",
    ",",
    ";",
    ":",
    "-",
    "--",
    "(",
    ")",
    "[x]",
    "{}",
    "<",
    ">",
    "\"",
    "#",
    "$",
    "%",
    "&&",
    "*",
    "+=",
    "/",
    "\\",
    "|",
    "~",
    "`",
    "^",
    "@",
    "_",
    "__init__",
    "x_y",
    "CamelCase",
    "ALLCAPS",
    "<s",
    "</",
    "<|",
    "|>",
    "<|endoftext",
    "\u{0}",
    "\u{7f}",
    "\u{1b}[0m",
];

/// `count` texts built from `words` (the fixtures'), `added` (the tokenizer's added tokens) and
/// [`FRAGMENTS`].
fn generated(words: &[String], added: &[String], count: usize, seed: u64) -> Vec<String> {
    let mut rng = Rng(seed);
    (0..count)
        .map(|_| {
            let mut text = String::new();
            for _ in 0..1 + rng.below(40) {
                match rng.below(10) {
                    0..=3 => text.push_str(&words[rng.below(words.len())]),
                    4 => {
                        let word: Vec<char> = words[rng.below(words.len())].chars().collect();
                        let (a, b) = (rng.below(word.len() + 1), rng.below(word.len() + 1));
                        text.extend(&word[a.min(b)..a.max(b)]);
                    }
                    5 if !added.is_empty() => text.push_str(&added[rng.below(added.len())]),
                    _ => text.push_str(FRAGMENTS[rng.below(FRAGMENTS.len())]),
                }
                if rng.below(3) == 0 {
                    text.push(' ');
                }
            }
            text
        })
        .collect()
}

/// The strings of the fixtures: held texts and every string in the data files.
fn fixture_texts(dir: &Path) -> Vec<String> {
    let table = support::json(&dir.join("tokenization.json"));
    let mut texts: Vec<String> = table["texts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    for entry in table["tokenizers"]
        .as_object()
        .expect("tokenizers")
        .values()
    {
        for case in entry["cases"].as_array().expect("cases") {
            texts.push(case["text"].as_str().expect("text").to_owned());
        }
    }
    for name in ["text.jsonl", "prompt_completion.jsonl", "messages.jsonl"] {
        let data = std::fs::read_to_string(dir.join("data").join(name)).expect("data file");
        for line in data.lines().filter(|l| !l.trim().is_empty()) {
            let row: Value = serde_json::from_str(line).expect("JSON line");
            collect_strings(&row, &mut texts);
        }
    }
    texts
}

fn collect_strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| collect_strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| collect_strings(v, out)),
        _ => {}
    }
}

/// Texts that may be added tokens in the fixtures' tokenizers and their variants.
const ADDED: &[&str] = &[
    "<|endoftext|>",
    "<s>",
    "</s>",
    "<unk>",
    "<pad>",
    "<|im_start|>",
    "<|im_end|>",
    "hello",
];

/// The corpus compared: the fixtures' strings, all of them joined, and generated texts.
fn corpus(dir: &Path) -> Vec<String> {
    let mut texts = fixture_texts(dir);
    let words: Vec<String> = texts
        .iter()
        .flat_map(|t| t.split(' '))
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect();
    let added: Vec<String> = ADDED.iter().map(|t| t.to_string()).collect();
    texts.push(texts.join(" "));
    texts.extend(generated(&words, &added, 6000, 31));
    texts
}

/// Asserts that the fast encoder takes `tokenizer` and agrees with the crate on every text:
/// ids with the cache (a first pass of misses and hits, a second of hits) and without it, and
/// the offsets.
fn assert_agrees(name: &str, tokenizer: &HfTokenizer, texts: &[String]) {
    if let Err(why) = tokenizer.fast_path() {
        panic!("{name}: {why}");
    }
    let uncached = tokenizer.clone().with_path(EncodePath::FastUncached);
    let mut tokens = 0;
    for pass in ["first", "second"] {
        for text in texts {
            for special in [AddSpecial::Yes, AddSpecial::No] {
                let fast = tokenizer.encode(text, special).expect("fast encodes");
                let oracle = tokenizer
                    .encode_by_crate(text, special)
                    .expect("crate encodes");
                assert_eq!(fast, oracle, "{name}, {pass} pass: {text:?} ({special:?})");
                tokens += fast.len();
                if pass == "second" {
                    let missed = uncached.encode(text, special).expect("uncached encodes");
                    assert_eq!(missed, oracle, "{name}, uncached: {text:?} ({special:?})");
                    let spans = tokenizer
                        .encode_with_offsets(text, special)
                        .expect("fast offsets");
                    let crate_spans = tokenizer
                        .encode_with_offsets_by_crate(text, special)
                        .expect("crate offsets");
                    assert_eq!(
                        spans, crate_spans,
                        "{name}, offsets: {text:?} ({special:?})"
                    );
                }
            }
        }
    }
    assert!(tokens > 200_000, "{name}: only {tokens} tokens compared");
}

/// Makes every piece the crate's pre-tokenizer cuts from `texts` one token (`ignore_merges`
/// returns a piece found whole in the vocabulary): with the fixtures' small vocabularies a
/// piece cut in the wrong place often gives the same ids, with these it cannot.
fn whole_pieces(tokenizer: &mut Value, texts: &[String]) {
    use std::str::FromStr;
    use tokenizers::PreTokenizer;
    let crate_side = tokenizers::Tokenizer::from_str(&tokenizer.to_string()).expect("crate loads");
    let pre = crate_side.get_pre_tokenizer().expect("a pre-tokenizer");
    let vocab = tokenizer["model"]["vocab"].as_object_mut().expect("vocab");
    let mut next = 10_000u64;
    for text in texts {
        let mut split = tokenizers::PreTokenizedString::from(text.as_str());
        pre.pre_tokenize(&mut split).expect("pre-tokenizes");
        for (piece, _, _) in split.get_splits(
            tokenizers::OffsetReferential::Original,
            tokenizers::OffsetType::Byte,
        ) {
            if !vocab.contains_key(piece) {
                vocab.insert(piece.to_owned(), json!(next));
                next += 1;
            }
        }
    }
    tokenizer["model"]["ignore_merges"] = json!(true);
}

fn model(dir: &Path, name: &str) -> PathBuf {
    dir.join("models").join(name)
}

/// A copy of the tokenizer directory `from` in `into` with `edit` applied to its
/// tokenizer.json.
fn variant(from: &Path, into: &Path, edit: impl FnOnce(&mut Value)) -> HfTokenizer {
    std::fs::create_dir_all(into).expect("variant dir");
    for entry in std::fs::read_dir(from).expect("model dir") {
        let path = entry.expect("entry").path();
        if path
            .extension()
            .is_some_and(|e| e == "json" || e == "jinja")
        {
            std::fs::copy(&path, into.join(path.file_name().expect("name"))).expect("copy");
        }
    }
    let mut value = support::json(&from.join("tokenizer.json"));
    edit(&mut value);
    std::fs::write(into.join("tokenizer.json"), value.to_string()).expect("write");
    HfTokenizer::from_dir(into).expect("variant loads")
}

fn split_then_bytes(pattern: &str) -> Value {
    json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
    ]})
}

#[test]
fn fixture_tokenizers_take_the_fast_path_with_the_crates_ids() {
    let Some(dir) = support::reference() else {
        return;
    };
    let corpus = corpus(&dir);
    for name in ["llama_bpe", "llama_sp"] {
        let tokenizer = HfTokenizer::from_dir(&model(&dir, name)).expect("loads");
        assert_agrees(name, &tokenizer, &corpus);
    }
}

#[test]
fn byte_level_variants_agree_with_the_crate() {
    let Some(dir) = support::reference() else {
        return;
    };
    let corpus = corpus(&dir);
    let temp = tempfile::tempdir().expect("temp dir");
    let from = model(&dir, "llama_bpe");
    let llama3_post = json!({"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}}}
    ]});
    let cases: Vec<(&str, Value, Value)> = vec![
        (
            "llama3 split",
            split_then_bytes(LLAMA3),
            llama3_post.clone(),
        ),
        ("qwen2 split", split_then_bytes(QWEN2), Value::Null),
        ("gpt2 split", split_then_bytes(GPT2), Value::Null),
        (
            "byte level with prefix space",
            json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}),
            llama3_post,
        ),
    ];
    for (n, (name, pre, post)) in cases.into_iter().enumerate() {
        let tokenizer = variant(&from, &temp.path().join(n.to_string()), |t| {
            t["pre_tokenizer"] = pre;
            t["post_processor"] = post;
            let added = t["added_tokens"].as_array_mut().expect("added_tokens");
            added.push(
                json!({"id": 500, "content": "hello", "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": true, "special": false}),
            );
            whole_pieces(t, &corpus);
        });
        assert_agrees(name, &tokenizer, &corpus);
    }
}

#[test]
fn metaspace_variants_agree_with_the_crate() {
    let Some(dir) = support::reference() else {
        return;
    };
    let corpus = corpus(&dir);
    let temp = tempfile::tempdir().expect("temp dir");
    let from = model(&dir, "llama_sp");
    for (n, (scheme, split)) in [
        ("always", true),
        ("never", false),
        ("first", true),
        ("always", false),
    ]
    .into_iter()
    .enumerate()
    {
        let tokenizer = variant(&from, &temp.path().join(n.to_string()), |t| {
            t["pre_tokenizer"]["prepend_scheme"] = json!(scheme);
            t["pre_tokenizer"]["split"] = json!(split);
            if split {
                whole_pieces(t, &corpus);
            }
        });
        assert_agrees(
            &format!("metaspace {scheme} split {split}"),
            &tokenizer,
            &corpus,
        );
    }
}

/// A change to a tokenizer.json.
type Edit = Box<dyn FnOnce(&mut Value)>;

#[test]
fn other_shapes_keep_the_crate_path_and_say_why() {
    let Some(dir) = support::reference() else {
        return;
    };
    let temp = tempfile::tempdir().expect("temp dir");
    let from = model(&dir, "llama_bpe");
    let edits: Vec<(&str, Edit)> = vec![
        (
            "normalizer",
            Box::new(|t: &mut Value| t["normalizer"] = json!({"type": "Lowercase"})),
        ),
        (
            "pre-tokenizer",
            Box::new(|t: &mut Value| t["pre_tokenizer"] = split_then_bytes(r"\w+|[^\w\s]+|\s+")),
        ),
        (
            "lstrip",
            Box::new(|t: &mut Value| t["added_tokens"][0]["lstrip"] = json!(true)),
        ),
    ];
    for (n, (why, edit)) in edits.into_iter().enumerate() {
        let tokenizer = variant(&from, &temp.path().join(n.to_string()), edit);
        let refused = tokenizer.fast_path().expect_err("refused");
        assert!(refused.to_string().contains(why), "{why}: {refused}");
        let text = "Hello <|endoftext|> World's 12345  end";
        assert_eq!(
            tokenizer.encode(text, AddSpecial::Yes).expect("encodes"),
            tokenizer
                .encode_by_crate(text, AddSpecial::Yes)
                .expect("encodes")
        );
    }
    let forced = HfTokenizer::from_dir(&from)
        .expect("loads")
        .with_path(EncodePath::Crate);
    assert!(forced.fast_path().is_err());
}

/// The conversations of the fixtures, rendered by llama_sp's template (it has
/// `{% generation %}` blocks, so the assistant mask needs offsets): the fast path's ids and
/// masks are the crate's, and the fast path did give offsets (a Metaspace tokenizer).
#[test]
fn chat_template_ids_and_masks_agree_with_the_crate() {
    let Some(dir) = support::reference() else {
        return;
    };
    let tokenizer = HfTokenizer::from_dir(&model(&dir, "llama_sp")).expect("loads");
    assert!(tokenizer.fast_offsets(), "llama_sp takes fast offsets");
    let by_crate = tokenizer.clone().with_path(EncodePath::Crate);
    assert!(!by_crate.fast_offsets());
    let mut masked = 0;
    for file in ["messages.jsonl", "messages_eval.jsonl"] {
        let text = std::fs::read_to_string(dir.join("data").join(file)).expect("data");
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let record: Value = serde_json::from_str(line).expect("json");
            let messages = &record["messages"];
            for prompt in [false, true] {
                let fast = tokenizer
                    .apply_chat_template(messages, prompt)
                    .expect("fast");
                let oracle = by_crate
                    .apply_chat_template(messages, prompt)
                    .expect("crate");
                assert_eq!(fast, oracle, "{line}");
                masked += fast.assistant_mask.iter().filter(|&&m| m).count();
            }
        }
    }
    assert!(masked > 1000, "only {masked} assistant tokens compared");
}
