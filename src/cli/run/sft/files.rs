//! The tokenizer files written next to a saved model (`--save-model DIR` of a fine-tuning
//! run), so the directory loads with `AutoTokenizer` as well as `AutoModelForCausalLM`.

use std::path::Path;

use dsplan_sft::HfTokenizer;

/// Copies the tokenizer's files (`tokenizer.json`, `tokenizer_config.json`, and
/// `chat_template.jinja` / `special_tokens_map.json` where present) into `dir`; returns their
/// names.
pub(in crate::cli::run) fn copy_tokenizer(
    tokenizer: &HfTokenizer,
    dir: &Path,
) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    for file in tokenizer.files() {
        let Some(name) = file.file_name() else {
            continue;
        };
        let target = dir.join(name);
        let staged = dir.join(format!(".{}.dsplan-tmp", name.to_string_lossy()));
        std::fs::copy(file, &staged)
            .and_then(|_| std::fs::rename(&staged, &target))
            .map_err(|e| {
                format!(
                    "cannot copy the tokenizer file {} into {}: {e}",
                    file.display(),
                    dir.display()
                )
            })?;
        names.push(name.to_string_lossy().into_owned());
    }
    Ok(names)
}
