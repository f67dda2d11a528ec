//! The typed model of DeepSpeed 0.19.8's `ds_config.json` and the JSON Schema generated from it.
