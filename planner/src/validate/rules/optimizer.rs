//! Optimizer and LR-scheduler rules: the `type` must name something DeepSpeed builds, the
//! `params` must be constructor arguments, ZeRO accepts only its tested optimizers, and LAMB
//! needs dynamic loss scaling (`research/deepspeed-facts.md` §2.5, §2.6).

use serde_json::{Map, Value};

use crate::config::registry::{self, OPTIMIZERS, OptimizerOrigin, SCHEDULERS};
use crate::diagnostics::{Code, Diagnostic};
use crate::json_pointer;
use crate::schedule::{LrSchedule, ScheduleErrorKind};
use crate::validate::suggest::{self, WORTH_SUGGESTING};
use crate::validate::view::{Stage, View};

/// Optimizer types ZeRO runs without `zero_allow_untested_optimizer`, derived from DeepSpeed
/// 0.19.8's `runtime/zero/utils.py:45-77`: `is_zero_supported_optimizer` accepts the classes of
/// `ZERO_SUPPORTED_OPTIMIZERS` (torch Adam, AdamW and Adagrad, FusedAdam, DeepSpeedCPUAdam,
/// ZenFlowCPUAdam, DeepSpeedCPUAdagrad, DeepSpeedCPULion, FusedLion) plus `MuonWithAuxAdam`,
/// which it appends at the first call. `runtime/engine.py:2506-2552` maps each `type` to its
/// class: adam/adamw to FusedAdam, DeepSpeedCPUAdam or torch Adam(W); adagrad to
/// DeepSpeedCPUAdagrad or torch Adagrad; lion to FusedLion or DeepSpeedCPULion; muon to
/// MuonWithAuxAdam. Lamb (FusedLamb), the mup optimizers and every other torch class are
/// untested.
const ZERO_TESTED: &[&str] = &["adam", "adamw", "adagrad", "lion", "muon"];

/// Every optimizer and scheduler problem in `view`.
pub fn check(view: View<'_>) -> Vec<Diagnostic> {
    let mut found = Vec::new();
    optimizer(view, &mut found);
    scheduler(view, &mut found);
    found
}

fn optimizer(view: View<'_>, found: &mut Vec<Diagnostic>) {
    let Some(kind) = view.string("/optimizer/type") else {
        return;
    };
    let Some(spec) = registry::optimizer_spec(kind) else {
        let names = OPTIMIZERS.iter().map(|spec| spec.name);
        let diagnostic = Diagnostic::error(
            Code::UnknownOptimizer,
            "/optimizer/type",
            format!(
                "`{kind}` is not an optimizer DeepSpeed can build: \"{kind} is not a supported DeepSpeed Optimizer\""
            ),
        );
        found.push(match suggest::nearest(kind, names, WORTH_SUGGESTING) {
            Some(best) => diagnostic.with_help(format!("did you mean `{best}`?")),
            None => diagnostic.with_help(
                "use one of Adam, AdamW, Adagrad, Lamb, Lion, or a torch.optim class name",
            ),
        });
        return;
    };
    if spec.origin == OptimizerOrigin::Removed {
        found.push(
            Diagnostic::error(
                Code::RemovedFeature,
                "/optimizer/type",
                format!("`{kind}`: {}", spec.note),
            )
            .with_help("use Adam or AdamW"),
        );
        return;
    }
    if let Some(Value::Object(params)) = view.get("/optimizer/params") {
        for key in params.keys() {
            if spec.params.contains(&key.as_str())
                || registry::removed_feature("/optimizer/params", key).is_some()
            {
                continue;
            }
            let diagnostic = Diagnostic::error(
                Code::UnknownOptimizerParam,
                json_pointer::child("/optimizer/params", key),
                format!(
                    "{} does not take a parameter `{key}`; its constructor would raise a TypeError",
                    spec.name
                ),
            );
            found.push(
                match suggest::nearest(key, spec.params.iter().copied(), WORTH_SUGGESTING) {
                    Some(best) => diagnostic.with_help(format!("did you mean `{best}`?")),
                    None => diagnostic.with_help(format!(
                        "{} takes: {}",
                        spec.name,
                        spec.params.join(", ")
                    )),
                },
            );
        }
    }
    let zero = view.stage().is_some_and(|stage| stage > Stage::Disabled);
    let tested = ZERO_TESTED
        .iter()
        .any(|name| name.eq_ignore_ascii_case(spec.name));
    if zero && !tested && view.bool("/zero_allow_untested_optimizer") != Some(true) {
        found.push(
            Diagnostic::error(
                Code::IncompatibleSettings,
                "/optimizer/type",
                format!("ZeRO refuses the untested optimizer {}: \"You are using an untested ZeRO Optimizer\"", spec.name),
            )
            .with_help("add `\"zero_allow_untested_optimizer\": true`, or use Adam/AdamW"),
        );
    }
    if spec.name.eq_ignore_ascii_case("lamb") {
        let static_fp16 =
            view.enabled("fp16") && view.number("/fp16/loss_scale").is_some_and(|s| s > 0.0);
        if view.enabled("bf16") || static_fp16 {
            found.push(
                Diagnostic::error(
                    Code::IncompatibleSettings,
                    "/optimizer/type",
                    "DeepSpeed's LAMB requires dynamic loss scaling; bf16 and a static fp16 loss_scale fix the scale",
                )
                .with_help("use fp16 with \"loss_scale\": 0, or another optimizer"),
            );
        }
    }
}

fn scheduler(view: View<'_>, found: &mut Vec<Diagnostic>) {
    let Some(kind) = view.string("/scheduler/type") else {
        return;
    };
    let empty = Map::new();
    let params = view
        .get("/scheduler/params")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    // "auto" values are filled later; check everything else.
    let auto: Vec<&str> = params
        .iter()
        .filter(|(_, value)| value.as_str() == Some("auto"))
        .map(|(key, _)| key.as_str())
        .collect();
    let concrete: Map<String, Value> = params
        .iter()
        .filter(|(key, _)| !auto.contains(&key.as_str()))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    let base_lr = view.number("/optimizer/params/lr").unwrap_or(1e-3);
    let error = match LrSchedule::from_params(kind, &concrete, base_lr) {
        Ok(_) => return,
        Err(error) => error,
    };
    let filled_later = error.kind == ScheduleErrorKind::MissingParameter
        && error.param.as_deref().is_some_and(|p| auto.contains(&p));
    if filled_later {
        return;
    }
    let pointer = match &error.param {
        Some(param) => json_pointer::child("/scheduler/params", param),
        None => "/scheduler/type".to_string(),
    };
    if error.kind == ScheduleErrorKind::TorchScheduler {
        found.push(
            Diagnostic::info(Code::UnknownScheduler, pointer, format!("`{kind}` is a torch.optim.lr_scheduler class: DeepSpeed builds it, dsplan does not model it"))
                .with_help(format!("dsplan models {}", SCHEDULERS.iter().map(|s| s.name).collect::<Vec<_>>().join(", "))),
        );
        return;
    }
    let diagnostic = Diagnostic::error(error.code(), pointer, error.message.clone());
    found.push(match &error.suggestion {
        Some(best) => diagnostic.with_help(format!("did you mean `{best}`?")),
        None => diagnostic,
    });
}
