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

impl Run {
    /// The run's world size.
    pub fn world_size(&self) -> usize {
        self.json["world_size"].as_u64().expect("world_size") as usize
    }

    /// `trajectory.json`.
    pub fn trajectory(&self) -> serde_json::Value {
        json(&self.dir.join("trajectory.json"))
    }

    /// Per step, `[rank][micro][rows]` as `trajectory.json` lists them.
    pub fn sample_indices(&self) -> Vec<Vec<Vec<Vec<usize>>>> {
        let indices = |value: &serde_json::Value| -> Vec<usize> {
            ints(value).into_iter().map(|i| i as usize).collect()
        };
        let world = self.world_size();
        self.trajectory()["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .map(|step| {
                let lists = step["sample_indices"].as_array().expect("sample_indices");
                if world == 1 {
                    vec![lists.iter().map(indices).collect()]
                } else {
                    lists
                        .iter()
                        .map(|rank| rank.as_array().expect("rank").iter().map(indices).collect())
                        .collect()
                }
            })
            .collect()
    }

    /// The bytes of rank `rank`'s `batches*.safetensors`.
    pub fn batches_file(&self, rank: usize) -> Vec<u8> {
        let name = if self.world_size() == 1 {
            "batches.safetensors".to_string()
        } else {
            format!("batches_rank{rank}.safetensors")
        };
        std::fs::read(self.dir.join(name)).expect("batches file")
    }
}

/// An int64 tensor of a safetensors file as its values and shape, or `None` when absent.
pub fn tensor(file: &safetensors::SafeTensors<'_>, name: &str) -> Option<(Vec<i64>, Vec<usize>)> {
    let view = file.tensor(name).ok()?;
    assert_eq!(view.dtype(), safetensors::Dtype::I64, "{name}");
    let values = view
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect();
    Some((values, view.shape().to_vec()))
}
