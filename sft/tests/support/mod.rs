//! Shared helpers of the dsplan-sft tests: where the TRL reference fixtures live.

#![allow(dead_code)]

use std::path::PathBuf;

/// `../shared/reference/sft` next to the workspace (or under `$DSPLAN_SHARED_DIR`), or `None`
/// with a message saying the test is skipped.
pub fn reference() -> Option<PathBuf> {
    let shared = std::env::var_os("DSPLAN_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared")));
    let dir = shared.join("reference/sft");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "skipping: {} not found (the TRL reference fixtures)",
            dir.display()
        );
        None
    }
}

/// A JSON file of the fixtures.
pub fn json(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("fixture file");
    serde_json::from_str(&text).expect("fixture JSON")
}

/// The run directories of the fixtures, by name.
pub const RUNS: [&str; 7] = [
    "text",
    "text_shuffled",
    "text_packed",
    "prompt_completion",
    "messages",
    "messages_assistant_only",
    "text_ws2",
];

/// A run's `run.json`.
pub struct Run {
    /// The fixtures' directory.
    pub root: PathBuf,
    /// The run's directory.
    pub dir: PathBuf,
    /// `run.json`.
    pub json: serde_json::Value,
}

impl Run {
    /// Reads run `name`.
    pub fn read(root: &std::path::Path, name: &str) -> Self {
        let dir = root.join("runs").join(name);
        let json = json(&dir.join("run.json"));
        Self {
            root: root.to_path_buf(),
            dir,
            json,
        }
    }

    /// A field of `sft_config` (every field, TRL's values).
    pub fn config(&self, field: &str) -> &serde_json::Value {
        &self.json["sft_config"][field]
    }

    /// The preparation settings the run used.
    pub fn settings(&self) -> dsplan_sft::PrepareSettings {
        use dsplan_sft::{AssistantLoss, CompletionLoss, Packing, PrepareSettings};
        PrepareSettings {
            max_length: self.config("max_length").as_u64().map(|n| n as usize),
            completion_loss: match self.config("completion_only_loss").as_bool() {
                None => CompletionLoss::Default,
                Some(true) => CompletionLoss::CompletionOnly,
                Some(false) => CompletionLoss::AllTokens,
            },
            assistant_loss: if self.config("assistant_only_loss").as_bool() == Some(true) {
                AssistantLoss::AssistantOnly
            } else {
                AssistantLoss::WholeConversation
            },
            packing: if self.config("packing").as_bool() == Some(true) {
                Packing::Bfd
            } else {
                Packing::Off
            },
            ..PrepareSettings::default()
        }
    }

    /// The run's tokenizer.
    pub fn tokenizer(&self) -> dsplan_sft::HfTokenizer {
        let model = self.root.join(self.json["model"].as_str().expect("model"));
        dsplan_sft::HfTokenizer::from_dir(&model).expect("tokenizer loads")
    }

    /// A data file of the run (`train_file` or `eval_file`).
    pub fn data(&self, which: &str) -> PathBuf {
        self.root
            .join(self.json[which].as_str().expect("data file"))
    }

    /// Train (`"train"`) or eval rows prepared by our code from the run's data.
    pub fn prepare(&self, split: &str) -> dsplan_sft::PreparedSet {
        let file = if split == "train" {
            "train_file"
        } else {
            "eval_file"
        };
        let reader = dsplan_sft::DatasetReader::open(&self.data(file), Default::default())
            .expect("dataset opens");
        dsplan_sft::prepare_dataset(
            reader,
            &self.tokenizer(),
            &self.settings(),
            dsplan_sft::OnBadRow::Stop,
        )
        .expect("prepares")
    }

    /// `prepared_{split}.jsonl` as TRL wrote it.
    pub fn expected_rows(&self, split: &str) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(self.dir.join(format!("prepared_{split}.jsonl")))
            .expect("prepared rows");
        text.lines()
            .map(|line| serde_json::from_str(line).expect("row JSON"))
            .collect()
    }
}

/// A JSON array of integers.
pub fn ints(value: &serde_json::Value) -> Vec<i64> {
    value
        .as_array()
        .expect("array")
        .iter()
        .map(|v| v.as_i64().expect("integer"))
        .collect()
}
