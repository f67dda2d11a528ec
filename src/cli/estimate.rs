//! `dsplan estimate`: DeepSpeed's ZeRO-2/ZeRO-3 model-state estimates for a model and a cluster.
//!
//! Human output prints DeepSpeed's two tables exactly as DeepSpeed documents them (`cpu ` /
//! `none`), then the model summary and any assumption. JSON output follows DESIGN.md's
//! "Estimate JSON" (`full` stays `null` until dsplan's own estimate lands).

use super::{Format, Outcome};
use crate::units;
use clap::{ArgGroup, Args, ValueEnum};
use dsplan_planner::estimate::{
    BufferFactor, DeepSpeedRow, EnumSpelling, Hardware, zero2_all_cold_text, zero2_table,
    zero3_all_cold_text, zero3_table,
};
use dsplan_planner::model::notes::thousands;
use dsplan_planner::model::{self, ErrorKind, LmHead, ModelSpec, presets};
use serde::Serialize;
use std::io::Write;

/// Arguments of `dsplan estimate`.
#[derive(Debug, Args)]
#[command(
    group(ArgGroup::new("model_source").required(true).args(["params", "model"])),
    after_long_help = presets_help()
)]
pub struct EstimateArgs {
    /// Total parameters: 2.7B, 350M, 65_798_144, 1.5e9.
    #[arg(long, value_name = "P", value_parser = units::count_arg)]
    params: Option<u64>,

    /// Parameters of the largest layer (one module's own parameters, DeepSpeed's definition).
    /// Without it, a GPT-3-shaped model of --params parameters is assumed and reported.
    #[arg(long, value_name = "L", requires = "params", value_parser = units::count_arg)]
    largest_layer: Option<u64>,

    /// A preset name or Hugging Face id (see below), a config.json, a *.safetensors file or a
    /// directory holding safetensors shards or a config.json.
    #[arg(long, value_name = "M")]
    model: Option<String>,

    /// One node with N GPUs.
    #[arg(long, value_name = "N", conflicts_with_all = ["gpus_per_node", "nodes"])]
    gpus: Option<u64>,

    /// GPUs per node (default 1).
    #[arg(long, value_name = "G")]
    gpus_per_node: Option<u64>,

    /// Number of nodes (default 1).
    #[arg(long, value_name = "K")]
    nodes: Option<u64>,

    /// DeepSpeed's additional_buffer_factor (multiplies the CPU estimates).
    #[arg(long, value_name = "F", default_value_t = 1.5)]
    buffer_factor: f64,

    /// Count the language-modelling head (default: exclude, the base model as AutoModel loads
    /// it, which is what DeepSpeed's documented examples measure).
    #[arg(long, value_enum, conflicts_with = "params")]
    lm_head: Option<LmHeadArg>,

    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

/// `--lm-head include|exclude`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LmHeadArg {
    /// Count the head (`*ForCausalLM`, `T5ForConditionalGeneration`, `BertForMaskedLM`).
    Include,
    /// Count the base model only (`AutoModel`).
    Exclude,
}

impl From<LmHeadArg> for LmHead {
    fn from(arg: LmHeadArg) -> LmHead {
        match arg {
            LmHeadArg::Include => LmHead::Include,
            LmHeadArg::Exclude => LmHead::Exclude,
        }
    }
}

/// The list of presets with their computed default counts, for `--help`.
fn presets_help() -> String {
    let mut help =
        String::from("Presets (parameters without the LM head; Hugging Face ids work too):\n");
    for preset in presets::PRESETS {
        let params = model::load::from_preset(preset, LmHead::Exclude).map_or_else(
            |error| error.to_string(),
            |spec| thousands(spec.total_params),
        );
        let hub_id = preset
            .hub_id
            .unwrap_or("(the reference GPT-2 fixtures' shape)");
        help.push_str(&format!("  {:<18} {:>17}  {hub_id}\n", preset.name, params));
    }
    help
}

/// The `estimate` JSON document.
#[derive(Serialize)]
struct EstimateJson<'a> {
    model: ModelJson<'a>,
    hardware: Hardware,
    additional_buffer_factor: BufferFactor,
    deepspeed: Vec<DeepSpeedRow>,
    full: Option<()>,
}

/// The `model` object: DESIGN.md's three keys first, then the details.
#[derive(Serialize)]
struct ModelJson<'a> {
    total_params: u64,
    largest_layer_params: u64,
    source: String,
    name: &'a str,
    largest_layer_module: Option<&'a str>,
    lm_head: Option<model::LmHeadReport>,
    architecture: Option<model::Architecture>,
    notes: &'a [model::Note],
}

/// Runs `dsplan estimate`.
pub fn run(args: EstimateArgs) -> Outcome {
    match estimate(&args) {
        Ok(text) => {
            let mut stdout = std::io::stdout().lock();
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
            Outcome::Success
        }
        Err((outcome, message)) => {
            eprintln!("error: {message}");
            outcome
        }
    }
}

type Failure = (Outcome, String);

fn usage(message: impl ToString) -> Failure {
    (Outcome::UsageError, message.to_string())
}

fn estimate(args: &EstimateArgs) -> Result<String, Failure> {
    let hardware = match args.gpus {
        Some(gpus) => Hardware::new(gpus, 1),
        None => Hardware::new(args.gpus_per_node.unwrap_or(1), args.nodes.unwrap_or(1)),
    }
    .map_err(usage)?;
    let factor = BufferFactor::new(args.buffer_factor).map_err(usage)?;
    let spec = model_spec(args)?;
    let total = spec.total_params;
    let largest = spec.largest_layer.params;
    let too_large = |error| {
        (
            Outcome::InputRejected,
            format!("{error} for this model and cluster"),
        )
    };

    match args.format {
        Format::Json => {
            let mut rows = zero2_table(total, hardware, factor).map_err(too_large)?;
            rows.extend(zero3_table(total, largest, hardware, factor).map_err(too_large)?);
            let document = EstimateJson {
                model: ModelJson {
                    total_params: total,
                    largest_layer_params: largest,
                    source: spec.source.to_string(),
                    name: &spec.name,
                    largest_layer_module: spec.largest_layer.module.as_deref(),
                    lm_head: spec.lm_head,
                    architecture: spec.architecture,
                    notes: &spec.notes,
                },
                hardware,
                additional_buffer_factor: factor,
                deepspeed: rows,
                full: None,
            };
            let json = serde_json::to_string_pretty(&document)
                .map_err(|error| (Outcome::UsageError, format!("cannot render JSON: {error}")))?;
            Ok(json + "\n")
        }
        Format::Human => {
            let spelling = EnumSpelling::Padded;
            let zero2 =
                zero2_all_cold_text(total, hardware, factor, spelling).map_err(too_large)?;
            let zero3 = zero3_all_cold_text(total, largest, hardware, factor, spelling)
                .map_err(too_large)?;
            Ok(format!("{zero2}\n{zero3}\n{}", summary(&spec)))
        }
    }
}

fn model_spec(args: &EstimateArgs) -> Result<ModelSpec, Failure> {
    let result = match (&args.model, args.params) {
        (Some(reference), _) => model::load(
            reference,
            args.lm_head.map(LmHead::from).unwrap_or_default(),
        ),
        (None, Some(params)) => model::from_params(params, args.largest_layer),
        (None, None) => return Err(usage("pass --params P or --model M")),
    };
    result.map_err(|error| {
        let outcome = match error.kind() {
            ErrorKind::UsageOrIo => Outcome::UsageError,
            ErrorKind::Input => Outcome::InputRejected,
        };
        (outcome, error.to_string())
    })
}

/// The model summary printed after DeepSpeed's tables.
fn summary(spec: &ModelSpec) -> String {
    let mut text = String::new();
    let origin = match &spec.source {
        model::ModelSource::Params => "given on the command line".to_owned(),
        model::ModelSource::Preset {
            hub_id: Some(hub_id),
            ..
        } => format!("built-in preset for {hub_id}"),
        model::ModelSource::Preset { hub_id: None, .. } => "built-in test preset".to_owned(),
        model::ModelSource::HfConfig { .. } => "Hugging Face config.json".to_owned(),
        model::ModelSource::Safetensors { files, tensors, .. } => {
            format!(
                "{tensors} tensors in {} safetensors file(s), headers only",
                files.len()
            )
        }
    };
    text.push_str(&format!("Model: {} ({origin})\n", spec.name));
    text.push_str(&format!(
        "  total params          {}\n",
        thousands(spec.total_params)
    ));
    let module = spec
        .largest_layer
        .module
        .as_deref()
        .map_or(String::new(), |module| format!(" (`{module}`)"));
    text.push_str(&format!(
        "  largest layer params  {}{module}\n",
        thousands(spec.largest_layer.params)
    ));
    if let Some(head) = spec.lm_head {
        let line = match (head.choice, head.extra_params) {
            (_, 0) => "adds no parameters (tied to the embeddings, or absent)".to_owned(),
            (LmHead::Exclude, extra) => {
                format!(
                    "not counted ({} params); --lm-head include counts it",
                    thousands(extra)
                )
            }
            (LmHead::Include, extra) => format!("counted ({} params)", thousands(extra)),
        };
        text.push_str(&format!("  LM head               {line}\n"));
    }
    if let Some(arch) = &spec.architecture {
        text.push_str(&format!("  architecture          {}\n", arch.describe()));
    }
    for note in &spec.notes {
        let label = match note {
            model::Note::InferredLargestLayer { .. } | model::Note::ConfigDefault { .. } => {
                "Assumption"
            }
            model::Note::ConfigDisagrees { .. } | model::Note::ConfigUnused { .. } => "Note",
        };
        text.push_str(&format!("{label}: {}\n", note.message()));
    }
    text
}
