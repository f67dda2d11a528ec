//! Model specifications: parameter counts and shapes from presets, Hugging Face `config.json`
//! files and safetensors headers.
