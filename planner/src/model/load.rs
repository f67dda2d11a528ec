//! Building a [`ModelSpec`] from each kind of source, and choosing the source from `--model`.

use super::architecture::Architecture;
use super::error::ModelError;
use super::notes::Note;
use super::presets::{self, Preset};
use super::safetensors::{self, Checkpoint};
use super::tensors::{self, LargestLayer, TensorEntry};
use super::{
    LmHead, LmHeadReport, MAX_PARAMS, ModelSource, ModelSpec, gpt_shape, hf_config, layouts,
};
use std::path::Path;

/// Tensor-name prefixes of LM heads in safetensors checkpoints (`*ForCausalLM`, T5,
/// `BertForMaskedLM` / `BertForPreTraining`).
const LM_HEAD_PREFIXES: &[&str] = &["lm_head.", "cls."];

/// Refuses counts above [`MAX_PARAMS`] (saturated sums land there too).
fn check_total(total: u64) -> Result<(), ModelError> {
    if total > MAX_PARAMS {
        Err(ModelError::TooManyParams { params: total })
    } else {
        Ok(())
    }
}

/// A model given only by its counts. Without `largest_layer`, the largest layer of an assumed
/// GPT-3-shaped model is used ([`gpt_shape`]) and reported as a [`Note`].
pub fn from_params(total_params: u64, largest_layer: Option<u64>) -> Result<ModelSpec, ModelError> {
    if total_params == 0 {
        return Err(ModelError::NoParameters {
            source: "--params".into(),
        });
    }
    check_total(total_params)?;
    let (largest, notes) = match largest_layer {
        Some(largest) if largest > total_params => {
            return Err(ModelError::LargestLayerExceedsTotal {
                largest_layer: largest,
                total: total_params,
            });
        }
        Some(largest) => (largest, Vec::new()),
        None => {
            let (largest, note) = gpt_shape::infer_largest_layer(total_params);
            (largest, vec![note])
        }
    };
    Ok(ModelSpec {
        name: format!("{} params", super::notes::thousands(total_params)),
        total_params,
        largest_layer: LargestLayer {
            params: largest,
            module: None,
        },
        lm_head: None,
        architecture: None,
        source: ModelSource::Params,
        notes,
    })
}

/// Counts of `arch` with and without its head.
struct ArchitectureCount {
    total: u64,
    largest_layer: LargestLayer,
    lm_head: LmHeadReport,
}

fn count_architecture(
    arch: &Architecture,
    lm_head: LmHead,
) -> Result<ArchitectureCount, ModelError> {
    arch.validate()?;
    // Each list is built once: a deep model has hundreds of thousands of tensors.
    let included = layouts::tensors(arch, LmHead::Include);
    let excluded = layouts::tensors(arch, LmHead::Exclude);
    let chosen = tensors::count(match lm_head {
        LmHead::Include => &included,
        LmHead::Exclude => &excluded,
    });
    let with_head = tensors::owned_total(&included);
    let without_head = tensors::owned_total(&excluded);
    check_total(chosen.total)?;
    Ok(ArchitectureCount {
        total: chosen.total,
        largest_layer: chosen.largest_layer,
        lm_head: LmHeadReport {
            choice: lm_head,
            extra_params: with_head.saturating_sub(without_head),
        },
    })
}

fn from_architecture(
    arch: Architecture,
    lm_head: LmHead,
    name: String,
    source: ModelSource,
    notes: Vec<Note>,
) -> Result<ModelSpec, ModelError> {
    let counted = count_architecture(&arch, lm_head)?;
    Ok(ModelSpec {
        name,
        total_params: counted.total,
        largest_layer: counted.largest_layer,
        lm_head: Some(counted.lm_head),
        architecture: Some(arch),
        source,
        notes,
    })
}

/// A built-in preset.
pub fn from_preset(preset: &'static Preset, lm_head: LmHead) -> Result<ModelSpec, ModelError> {
    let source = ModelSource::Preset {
        name: preset.name,
        hub_id: preset.hub_id,
    };
    from_architecture(
        preset.architecture,
        lm_head,
        preset.name.to_owned(),
        source,
        Vec::new(),
    )
}

/// A Hugging Face `config.json`.
pub fn from_config_file(path: &Path, lm_head: LmHead) -> Result<ModelSpec, ModelError> {
    let (arch, notes) = hf_config::read(path)?;
    let source = ModelSource::HfConfig {
        path: path.to_owned(),
    };
    from_architecture(arch, lm_head, path.display().to_string(), source, notes)
}

/// A safetensors checkpoint: one file, or a directory (sharded with an index, or not). A
/// `config.json` beside it supplies the architecture and is cross-checked against the count.
pub fn from_safetensors(path: &Path, lm_head: LmHead) -> Result<ModelSpec, ModelError> {
    let (dir, files) = if path.is_dir() {
        (path, safetensors::checkpoint_files(path)?)
    } else {
        (
            path.parent().unwrap_or(Path::new(".")),
            vec![path.to_owned()],
        )
    };
    if files.is_empty() {
        return Err(ModelError::NothingToRead {
            dir: path.to_owned(),
        });
    }
    let Checkpoint {
        files,
        tensors: all,
    } = safetensors::read_checkpoint(files)?;
    let is_head = |tensor: &TensorEntry| {
        LM_HEAD_PREFIXES
            .iter()
            .any(|prefix| tensor.name.starts_with(prefix))
    };
    let head_params = all
        .iter()
        .filter(|tensor| is_head(tensor))
        .fold(0u64, |sum, t| sum.saturating_add(t.numel));
    let kept: Vec<TensorEntry> = match lm_head {
        LmHead::Include => all,
        LmHead::Exclude => all.into_iter().filter(|tensor| !is_head(tensor)).collect(),
    };
    let counted = tensors::count(&kept);
    if counted.total == 0 {
        return Err(ModelError::NoParameters {
            source: format!("`{}`", path.display()),
        });
    }
    check_total(counted.total)?;
    let mut notes = Vec::new();
    let architecture = config_beside(dir, lm_head, counted.total, &mut notes);
    Ok(ModelSpec {
        name: path.display().to_string(),
        total_params: counted.total,
        largest_layer: counted.largest_layer,
        lm_head: Some(LmHeadReport {
            choice: lm_head,
            extra_params: head_params,
        }),
        architecture,
        source: ModelSource::Safetensors {
            path: path.to_owned(),
            files,
            tensors: counted.owned_tensors,
        },
        notes,
    })
}

/// The architecture from `dir/config.json`, if there is one dsplan understands; notes when it
/// cannot be used or disagrees with the checkpoint's count.
fn config_beside(
    dir: &Path,
    lm_head: LmHead,
    checkpoint_params: u64,
    notes: &mut Vec<Note>,
) -> Option<Architecture> {
    let path = dir.join("config.json");
    if !crate::user_file::exists(&path) {
        return None;
    }
    let parsed = hf_config::read(&path)
        .and_then(|(arch, _)| Ok((arch, count_architecture(&arch, lm_head)?)));
    match parsed {
        Ok((arch, counted)) => {
            if counted.total != checkpoint_params {
                notes.push(Note::ConfigDisagrees {
                    config_params: counted.total,
                    checkpoint_params,
                });
            }
            Some(arch)
        }
        Err(error) => {
            notes.push(Note::ConfigUnused {
                reason: error.to_string(),
            });
            None
        }
    }
}

/// The model `reference` names: an existing path (a `config.json`, a `*.safetensors` file or
/// a directory holding either), else a preset name or Hugging Face id.
pub fn load(reference: &str, lm_head: LmHead) -> Result<ModelSpec, ModelError> {
    let path = Path::new(reference);
    if path.is_dir() {
        let has_weights = !safetensors::checkpoint_files(path)?.is_empty();
        let config = path.join("config.json");
        return if has_weights {
            from_safetensors(path, lm_head)
        } else if crate::user_file::exists(&config) {
            from_config_file(&config, lm_head)
        } else {
            Err(ModelError::NothingToRead {
                dir: path.to_owned(),
            })
        };
    }
    // Anything there but a directory is read as a file: a FIFO or a device is then refused by
    // what it is, not taken for a preset name.
    if crate::user_file::exists(path) {
        return if path
            .extension()
            .is_some_and(|extension| extension == "safetensors")
        {
            from_safetensors(path, lm_head)
        } else {
            from_config_file(path, lm_head)
        };
    }
    if let Some(preset) = presets::find(reference) {
        return from_preset(preset, lm_head);
    }
    let looks_like_path = reference.ends_with(".json")
        || reference.ends_with(".safetensors")
        || reference.starts_with('.');
    if looks_like_path {
        return Err(ModelError::Unreadable {
            path: path.to_owned(),
            reason: "no such file or directory".into(),
        });
    }
    presets::lookup(reference).and_then(|preset| from_preset(preset, lm_head))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preset(name: &str, lm_head: LmHead) -> ModelSpec {
        let preset = presets::lookup(name).expect("preset exists");
        from_preset(preset, lm_head).expect("valid preset")
    }

    /// Published parameter counts (model cards, `model.num_parameters()`), with the head the
    /// published figure includes.
    #[test]
    fn presets_reproduce_published_counts() {
        let published: &[(&str, LmHead, u64)] = &[
            ("gpt2", LmHead::Include, 124_439_808),
            ("gpt2-medium", LmHead::Include, 354_823_168),
            ("gpt2-large", LmHead::Include, 774_030_080),
            ("gpt2-xl", LmHead::Include, 1_557_611_200),
            ("llama-2-7b", LmHead::Include, 6_738_415_616),
            ("llama-2-13b", LmHead::Include, 13_015_864_320),
            ("llama-2-70b", LmHead::Include, 68_976_648_192),
            ("llama-3-8b", LmHead::Include, 8_030_261_248),
            ("llama-3-70b", LmHead::Include, 70_553_706_496),
            ("mistral-7b", LmHead::Include, 7_241_732_096),
            ("qwen2-7b", LmHead::Include, 7_615_616_512),
            ("bloom-176b", LmHead::Include, 176_247_271_424),
            ("bert-base-uncased", LmHead::Exclude, 109_482_240),
            // DeepSpeed's documented T0_3B table: AutoModel (T5Model), deepspeed-facts §1.5.
            ("t0-3b", LmHead::Exclude, 2_783_959_040),
            ("t5-3b", LmHead::Include, 2_851_598_336),
            // The reference GPT-2 fixture's `model.safetensors` holds 120,576 parameters.
            ("tiny-gpt2", LmHead::Include, 120_576),
        ];
        for &(name, lm_head, expected) in published {
            assert_eq!(preset(name, lm_head).total_params, expected, "{name}");
        }
    }

    #[test]
    fn largest_layers_follow_deepspeed() {
        let t0 = preset("t0-3b", LmHead::Exclude);
        assert_eq!(
            t0.largest_layer,
            LargestLayer {
                params: 65_798_144,
                module: Some("shared".into())
            }
        );
        let gpt2 = preset("gpt2", LmHead::Include);
        assert_eq!(gpt2.largest_layer.params, 50_257 * 768);
        // t5-3b: the shared 32128 x 1024 embedding (DeepSpeed's docs print "32M largest layer").
        assert_eq!(
            preset("t5-3b", LmHead::Exclude).largest_layer.params,
            32_899_072
        );
        // BertForMaskedLM's decoder Linear holds the tied matrix and the bias: V*h + V.
        assert_eq!(
            preset("bert-base-uncased", LmHead::Include)
                .largest_layer
                .params,
            30_522 * 768 + 30_522
        );
    }

    #[test]
    fn lm_head_choice_changes_untied_models_only() {
        let base = preset("llama-2-7b", LmHead::Exclude);
        assert_eq!(base.total_params, 6_738_415_616 - 32_000 * 4096);
        assert_eq!(
            base.lm_head.map(|head| head.extra_params),
            Some(32_000 * 4096)
        );
        let t0 = preset("t0-3b", LmHead::Include);
        assert_eq!(t0.total_params, 2_783_959_040 + 32_128 * 2048);
        for name in ["gpt2", "t5-3b", "bloom-176b"] {
            assert_eq!(
                preset(name, LmHead::Include).total_params,
                preset(name, LmHead::Exclude).total_params
            );
        }
    }

    #[test]
    fn params_only_models() {
        let given = from_params(2_783_959_040, Some(65_798_144)).expect("valid");
        assert_eq!(given.largest_layer.params, 65_798_144);
        assert!(given.notes.is_empty());
        let inferred = from_params(2_700_000_000, None).expect("valid");
        assert!(matches!(
            inferred.notes.as_slice(),
            [Note::InferredLargestLayer { .. }]
        ));
        assert!(matches!(
            from_params(10, Some(11)),
            Err(ModelError::LargestLayerExceedsTotal { .. })
        ));
        assert!(matches!(
            from_params(0, None),
            Err(ModelError::NoParameters { .. })
        ));
        assert!(matches!(
            from_params(u64::MAX, None),
            Err(ModelError::TooManyParams { .. })
        ));
    }

    #[test]
    fn unknown_names_suggest_a_preset() {
        let error = load("llama2-7b", LmHead::Exclude).expect_err("not a preset");
        assert!(
            error.to_string().contains("did you mean `llama-2-7b`?"),
            "{error}"
        );
        let missing = load("./nowhere/config.json", LmHead::Exclude).expect_err("no file");
        assert!(matches!(missing, ModelError::Unreadable { .. }));
    }
}

#[cfg(test)]
mod file_tests {
    use super::super::test_files::{TempDir, write_safetensors};
    use super::*;

    const TINY_LLAMA: &str = r#"{"model_type": "llama", "hidden_size": 16, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 40,
        "vocab_size": 50, "max_position_embeddings": 64, "tie_word_embeddings": false,
        "attention_bias": false, "mlp_bias": false}"#;

    /// The tensors of the tiny Llama above, as (name, flat shape).
    fn tiny_llama_tensors() -> Vec<(String, Vec<u64>)> {
        let (arch, _) = hf_config::parse(TINY_LLAMA, Path::new("config.json")).expect("valid");
        layouts::tensors(&arch, LmHead::Include)
            .into_iter()
            .map(|t| (t.name, vec![t.numel]))
            .collect()
    }

    fn as_refs(part: &[(String, Vec<u64>)]) -> Vec<(&str, Vec<u64>)> {
        part.iter()
            .map(|(name, shape)| (name.as_str(), shape.clone()))
            .collect()
    }

    #[test]
    fn sharded_checkpoint_counts_match_its_config() {
        let dir = TempDir::new("sharded");
        let tensors = tiny_llama_tensors();
        let (first, second) = tensors.split_at(tensors.len() / 2);
        write_safetensors(
            &dir.path().join("model-00001-of-00002.safetensors"),
            &as_refs(first),
        );
        write_safetensors(
            &dir.path().join("model-00002-of-00002.safetensors"),
            &as_refs(second),
        );
        // A stray file the index does not name must be ignored.
        write_safetensors(
            &dir.path().join("optimizer.safetensors"),
            &[("exp_avg", vec![1000])],
        );
        let mut weight_map = serde_json::Map::new();
        for (name, _) in first {
            weight_map.insert(name.clone(), "model-00001-of-00002.safetensors".into());
        }
        for (name, _) in second {
            weight_map.insert(name.clone(), "model-00002-of-00002.safetensors".into());
        }
        let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
        std::fs::write(dir.path().join(safetensors::INDEX_FILE), index.to_string()).expect("write");
        std::fs::write(dir.path().join("config.json"), TINY_LLAMA).expect("write");

        let reference = dir.path().to_str().expect("utf-8 path");
        let config =
            from_config_file(&dir.path().join("config.json"), LmHead::Include).expect("valid");
        for lm_head in [LmHead::Include, LmHead::Exclude] {
            let spec = load(reference, lm_head).expect("readable checkpoint");
            let config = from_config_file(&dir.path().join("config.json"), lm_head).expect("valid");
            assert_eq!(spec.total_params, config.total_params, "{lm_head:?}");
            assert_eq!(spec.largest_layer, config.largest_layer, "{lm_head:?}");
            assert!(spec.notes.is_empty(), "{:?}", spec.notes);
            assert!(
                matches!(&spec.source, ModelSource::Safetensors { files, .. } if files.len() == 2)
            );
            assert_eq!(spec.lm_head.map(|head| head.extra_params), Some(50 * 16));
        }
        assert_eq!(
            config.total_params,
            tensors.iter().map(|(_, shape)| shape[0]).sum::<u64>()
        );
    }

    #[test]
    fn model_safetensors_is_preferred_and_disagreement_is_noted() {
        let dir = TempDir::new("single");
        write_safetensors(
            &dir.path().join("model.safetensors"),
            &[("h.0.fc.weight", vec![4, 8])],
        );
        write_safetensors(
            &dir.path().join("grads.safetensors"),
            &[("h.0.fc.weight", vec![4, 8])],
        );
        std::fs::write(dir.path().join("config.json"), TINY_LLAMA).expect("write");
        let spec = load(dir.path().to_str().expect("utf-8"), LmHead::Exclude).expect("readable");
        assert_eq!(spec.total_params, 32);
        assert!(matches!(
            spec.notes.as_slice(),
            [Note::ConfigDisagrees {
                checkpoint_params: 32,
                ..
            }]
        ));
    }

    #[test]
    fn broken_checkpoints_are_errors() {
        let dir = TempDir::new("broken");
        write_safetensors(&dir.path().join("a.safetensors"), &[("w", vec![2])]);
        write_safetensors(&dir.path().join("b.safetensors"), &[("w", vec![2])]);
        let duplicate =
            load(dir.path().to_str().expect("utf-8"), LmHead::Exclude).expect_err("duplicate");
        assert!(
            matches!(duplicate, ModelError::DuplicateTensor { ref name, .. } if name == "w"),
            "{duplicate}"
        );

        let truncated = dir.path().join("truncated.safetensors");
        std::fs::write(&truncated, [200, 0, 0, 0, 0, 0, 0, 0, b'{']).expect("write");
        let error =
            load(truncated.to_str().expect("utf-8"), LmHead::Exclude).expect_err("truncated");
        assert!(
            matches!(error, ModelError::BadSafetensors { .. }),
            "{error}"
        );

        let empty = TempDir::new("empty");
        let error =
            load(empty.path().to_str().expect("utf-8"), LmHead::Exclude).expect_err("empty");
        assert!(matches!(error, ModelError::NothingToRead { .. }), "{error}");
    }

    #[test]
    fn a_directory_with_only_a_config_uses_it() {
        let dir = TempDir::new("config-only");
        std::fs::write(dir.path().join("config.json"), TINY_LLAMA).expect("write");
        let spec = load(dir.path().to_str().expect("utf-8"), LmHead::Exclude).expect("config");
        assert!(matches!(spec.source, ModelSource::HfConfig { .. }));
        assert_eq!(spec.architecture.map(|arch| arch.kv_heads), Some(2));
    }
}
