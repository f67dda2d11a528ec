//! `dsplan schema`: the JSON Schema of `ds_config.json`, byte for byte the committed
//! `schemas/ds_config.schema.json`.

use super::Outcome;

/// Print the schema to stdout.
pub fn run() -> Outcome {
    print!("{}", dsplan_planner::config::schema_text());
    Outcome::Success
}
