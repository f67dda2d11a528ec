//! `{% generation %} ... {% endgeneration %}`: the block tag transformers' `AssistantTracker`
//! adds to Jinja to record which characters of a rendered conversation the assistant wrote
//! (`return_assistant_tokens_mask`). minijinja has no custom tags, so before the template is
//! compiled each tag becomes an `{% if true %}` block printing a marker character from Unicode's
//! private-use area; after rendering, the markers are removed and their byte positions are the
//! spans. The tag's whitespace control (`{%-`, `-%}`, `+`) stays on the outer ends, and
//! `trim_blocks` / `lstrip_blocks` act on the `if` / `endif` tags exactly where they acted on
//! the originals, so the text around a block renders as Jinja renders it.

use std::ops::Range;

/// Printed where a generation block opens.
pub const OPEN: char = '\u{E000}';
/// Printed where a generation block closes.
pub const CLOSE: char = '\u{E001}';

/// `source` with every generation tag replaced (see the [module docs](self)), and whether it
/// had any.
pub fn rewrite(source: &str) -> (String, bool) {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    let mut found = false;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return (out, found);
        };
        let inner = &tag[2..end];
        let (left, body) = strip_modifier_start(inner);
        let (body, right) = strip_modifier_end(body);
        match body.trim() {
            "generation" => {
                found = true;
                out.push_str(&format!(
                    "{{%{left} if true %}}{{{{ \"{OPEN}\" }}}}{{% endif {right}%}}"
                ));
            }
            "endgeneration" => {
                out.push_str(&format!(
                    "{{%{left} if true %}}{{{{ \"{CLOSE}\" }}}}{{% endif {right}%}}"
                ));
            }
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    (out, found)
}

fn strip_modifier_start(inner: &str) -> (&str, &str) {
    match inner.chars().next() {
        Some(c @ ('-' | '+')) => inner.split_at(c.len_utf8()),
        _ => ("", inner),
    }
}

fn strip_modifier_end(inner: &str) -> (&str, &str) {
    match inner.chars().last() {
        Some(c @ ('-' | '+')) => inner.split_at(inner.len() - c.len_utf8()),
        _ => (inner, ""),
    }
}

/// The rendered text without its markers and the byte spans of the generation blocks, or the
/// reason the markers do not pair up.
pub fn extract(rendered: &str) -> Result<(String, Vec<Range<usize>>), String> {
    let mut text = String::with_capacity(rendered.len());
    let mut spans = Vec::new();
    let mut open: Option<usize> = None;
    for c in rendered.chars() {
        match c {
            OPEN if open.is_none() => open = Some(text.len()),
            OPEN => return Err("a {% generation %} block opens inside another".into()),
            CLOSE => match open.take() {
                Some(start) => spans.push(start..text.len()),
                None => return Err("{% endgeneration %} without its {% generation %}".into()),
            },
            _ => text.push(c),
        }
    }
    if open.is_some() {
        return Err("a {% generation %} block is never closed".into());
    }
    Ok((text, spans))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_keep_their_whitespace_control_and_spans_come_out() {
        let (rewritten, found) = rewrite("a{%- generation +%}b{% endgeneration -%}c{% if x %}");
        assert!(found);
        assert_eq!(
            rewritten,
            "a{%- if true %}{{ \"\u{E000}\" }}{% endif +%}b{% if true %}{{ \"\u{E001}\" }}{% endif -%}c{% if x %}"
        );
        let (text, spans) = extract("x\u{E000}yz\u{E001}w").expect("paired");
        assert_eq!(text, "xyzw");
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0], 1..3);
        assert!(extract("\u{E001}").is_err());
        assert!(extract("\u{E000}").is_err());
    }
}
