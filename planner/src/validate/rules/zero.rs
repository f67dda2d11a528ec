//! ZeRO and offload rules: settings that do nothing at the configured stage, offload targets
//! without their paths, and the combinations DeepSpeed's ZeRO optimizers assert against
//! (`research/deepspeed-facts.md` §2.2, §3.3).

use crate::diagnostics::{Code, Diagnostic};
use crate::json_pointer;
use crate::validate::view::{OffloadSection, OffloadTarget, Stage, View};

/// `zero_optimization` keys that only the stage-3 engine reads, in every spelling.
const STAGE3_ONLY: &[&str] = &[
    "stage3_prefetch_bucket_size",
    "prefetch_bucket_size",
    "stage3_param_persistence_threshold",
    "param_persistence_threshold",
    "stage3_model_persistence_threshold",
    "model_persistence_threshold",
    "stage3_max_live_parameters",
    "max_live_parameters",
    "stage3_max_reuse_distance",
    "max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save",
    "gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save",
    "stage3_module_granularity_threshold",
    "module_granularity_threshold",
    "stage3_use_all_reduce_for_fetch_params",
    "use_all_reduce_for_fetch_params",
];

/// Spellings of the "gather 16-bit weights when saving" switch, newest first.
const GATHER_ON_SAVE: &[&str] = &[
    "/zero_optimization/gather_16bit_weights_on_model_save",
    "/zero_optimization/stage3_gather_16bit_weights_on_model_save",
    "/zero_optimization/stage3_gather_fp16_weights_on_model_save",
];

/// Every ZeRO/offload problem in `view`.
pub fn check(view: View<'_>) -> Vec<Diagnostic> {
    let Some(stage) = view.stage() else {
        return Vec::new(); // an unreadable stage is the schema check's to report
    };
    let mut found = Vec::new();
    offload_rules(view, stage, &mut found);
    if stage < Stage::Parameters {
        stage3_settings_below_stage3(view, stage, &mut found);
    } else {
        empty_model_save(view, &mut found);
    }
    reduce_scatter_rules(view, stage, &mut found);
    if stage > Stage::Disabled
        && stage < Stage::Parameters
        && let Some(size) = view.number("/zero_optimization/allgather_bucket_size")
        && size % 2.0 != 0.0
    {
        found.push(
                    Diagnostic::error(
                        Code::IncompatibleSettings,
                        "/zero_optimization/allgather_bucket_size",
                        format!("allgather_bucket_size {size} is odd; ZeRO stages 1 and 2 assert it is a multiple of 2"),
                    )
                    .with_help(format!("use {}", size + 1.0)),
                );
    }
    if view.bool("/zero_optimization/legacy_stage1") == Some(true) {
        found.push(
            Diagnostic::error(
                Code::RemovedFeature,
                "/zero_optimization/legacy_stage1",
                "the legacy ZeRO stage 1 implementation was removed in DeepSpeed 0.5.9",
            )
            .with_help("remove `legacy_stage1`; stage 1 uses the current implementation"),
        );
    }
    found
}

fn offload_rules(view: View<'_>, stage: Stage, found: &mut Vec<Diagnostic>) {
    let param = view.offload(OffloadSection::Param);
    if param != OffloadTarget::None && stage < Stage::Parameters {
        found.push(
            Diagnostic::error(
                Code::IneffectiveAtStage,
                OffloadSection::Param.pointer(),
                format!(
                    "parameter offload needs ZeRO stage 3, but the stage is {}; DeepSpeed silently ignores `offload_param`",
                    stage as u8
                ),
            )
            .with_help("set zero_optimization.stage to 3, or remove `offload_param` (optimizer offload works from stage 1)"),
        );
    }
    for section in [OffloadSection::Param, OffloadSection::Optimizer] {
        if view.offload(section) != OffloadTarget::Nvme {
            continue;
        }
        let path = json_pointer::child(section.pointer(), "nvme_path");
        let silently_cpu = section == OffloadSection::Optimizer && stage < Stage::Parameters;
        if silently_cpu {
            found.push(
                Diagnostic::warning(
                    Code::IneffectiveAtStage,
                    json_pointer::child(section.pointer(), "device"),
                    format!("NVMe optimizer offload needs ZeRO stage 3; at stage {} DeepSpeed silently offloads to CPU memory instead", stage as u8),
                )
                .with_help("set zero_optimization.stage to 3 for NVMe, or write \"cpu\" to say what actually happens"),
            );
        } else if view.string(&path).is_none_or(str::is_empty) {
            found.push(
                Diagnostic::error(
                    Code::NvmeWithoutPath,
                    json_pointer::child(section.pointer(), "device"),
                    "NVMe offload without `nvme_path`: DeepSpeed fails when it opens the swap files",
                )
                .with_help("add `\"nvme_path\": \"/local_nvme\"` (a directory on a fast local NVMe drive)"),
            );
        }
    }
    if let Some(ratio) = view.number("/zero_optimization/offload_optimizer/ratio")
        && ratio < 1.0
        && stage < Stage::Parameters
    {
        found.push(
            Diagnostic::error(
                Code::IncompatibleSettings,
                "/zero_optimization/offload_optimizer/ratio",
                "partial optimizer offload (ratio < 1) is only supported with ZeRO stage 3",
            )
            .with_help("set zero_optimization.stage to 3, or remove `ratio`"),
        );
    }
}

fn stage3_settings_below_stage3(view: View<'_>, stage: Stage, found: &mut Vec<Diagnostic>) {
    for key in STAGE3_ONLY {
        let pointer = json_pointer::child("/zero_optimization", key);
        if view.has(&pointer) {
            found.push(
                Diagnostic::warning(
                    Code::IneffectiveAtStage,
                    pointer,
                    format!(
                        "`{key}` only applies to ZeRO stage 3; at stage {} it has no effect",
                        stage as u8
                    ),
                )
                .with_help("remove it, or set zero_optimization.stage to 3"),
            );
        }
    }
}

fn empty_model_save(view: View<'_>, found: &mut Vec<Diagnostic>) {
    let gather = view.first_present(GATHER_ON_SAVE);
    let enabled = gather.and_then(|(_, value)| value.as_bool());
    if enabled == Some(true) {
        return;
    }
    let pointer = gather.map_or("/zero_optimization", |(pointer, _)| pointer);
    let state = if gather.is_some() {
        "is false"
    } else {
        "is not set (default false)"
    };
    found.push(
        Diagnostic::warning(
            Code::EmptyModelSave,
            pointer,
            format!("ZeRO stage 3 with `gather_16bit_weights_on_model_save` {state}: a model saved with `save_pretrained`/`save_model` will hold empty placeholder tensors"),
        )
        .with_help("set `\"stage3_gather_16bit_weights_on_model_save\": true`, or plan to consolidate the checkpoint with zero_to_fp32.py"),
    );
}

fn reduce_scatter_rules(view: View<'_>, stage: Stage, found: &mut Vec<Diagnostic>) {
    let reduce_scatter = view
        .bool("/zero_optimization/reduce_scatter")
        .unwrap_or(true);
    if stage < Stage::Gradients || !reduce_scatter {
        return;
    }
    if let Some(factor) = view.number("/gradient_predivide_factor")
        && factor != 1.0
    {
        found.push(
                Diagnostic::error(
                    Code::IncompatibleSettings,
                    "/gradient_predivide_factor",
                    format!("gradient_predivide_factor {factor} is not supported with ZeRO stage {} and reduce_scatter", stage as u8),
                )
                .with_help("remove gradient_predivide_factor, or set zero_optimization.reduce_scatter to false"),
            );
    }
    if view.bool("/prescale_gradients") == Some(true) {
        found.push(
            Diagnostic::error(
                Code::IncompatibleSettings,
                "/prescale_gradients",
                format!(
                    "prescale_gradients is not supported with ZeRO stage {} and reduce_scatter",
                    stage as u8
                ),
            )
            .with_help(
                "set prescale_gradients to false, or zero_optimization.reduce_scatter to false",
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn codes(document: serde_json::Value) -> Vec<(Code, String)> {
        check(View::new(&document))
            .into_iter()
            .map(|d| (d.code, d.pointer))
            .collect()
    }

    #[test]
    fn offload_param_below_stage3_is_an_error() {
        let found =
            codes(json!({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}));
        assert_eq!(
            found,
            vec![(
                Code::IneffectiveAtStage,
                "/zero_optimization/offload_param".into()
            )]
        );
    }

    #[test]
    fn nvme_needs_a_path_at_stage3_and_is_cpu_below() {
        let found = codes(
            json!({"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": true,
            "offload_param": {"device": "nvme"}, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}}),
        );
        assert_eq!(
            found,
            vec![(
                Code::NvmeWithoutPath,
                "/zero_optimization/offload_param/device".into()
            )]
        );
        let found = codes(
            json!({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}}),
        );
        assert_eq!(
            found,
            vec![(
                Code::IneffectiveAtStage,
                "/zero_optimization/offload_optimizer/device".into()
            )]
        );
    }

    #[test]
    fn stage3_keys_below_stage3_warn() {
        let found = check(View::new(
            &json!({"zero_optimization": {"stage": 2, "stage3_max_live_parameters": 1e9}}),
        ));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].code, Code::IneffectiveAtStage);
        assert!(!found[0].is_error());
    }

    #[test]
    fn stage3_without_gather_warns_of_empty_saves() {
        let found = codes(json!({"zero_optimization": {"stage": 3}}));
        assert_eq!(
            found,
            vec![(Code::EmptyModelSave, "/zero_optimization".into())]
        );
        let found = codes(
            json!({"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": false}}),
        );
        assert_eq!(
            found,
            vec![(
                Code::EmptyModelSave,
                "/zero_optimization/stage3_gather_16bit_weights_on_model_save".into()
            )]
        );
    }

    #[test]
    fn reduce_scatter_forbids_predivide_and_prescale() {
        let found = codes(
            json!({"gradient_predivide_factor": 2.0, "prescale_gradients": true, "zero_optimization": {"stage": 2}}),
        );
        assert_eq!(found.len(), 2);
        assert!(
            codes(json!({"gradient_predivide_factor": 2.0, "zero_optimization": {"stage": 1}}))
                .is_empty()
        );
    }
}
