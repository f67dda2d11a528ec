//! Slurm's compressed host lists (`SLURM_JOB_NODELIST`): `node[01-03,07],gpu5` is `node01`,
//! `node02`, `node03`, `node07`, `gpu5`. A range keeps the zero padding of its first number;
//! several bracket groups in one name expand left to right (`r[1-2]n[1-2]` is `r1n1, r1n2,
//! r2n1, r2n2`).

/// Every host of `list`, in order, or `None` when the list is malformed (an unclosed bracket, a
/// range that is not two numbers, an empty name).
pub fn expand(list: &str) -> Option<Vec<String>> {
    let mut hosts = Vec::new();
    for item in split_top_level(list.trim())? {
        expand_item(item, &mut hosts)?;
    }
    (!hosts.is_empty()).then_some(hosts)
}

/// The first host of `list` (the job's master under `srun`), or `None` when it is malformed.
pub fn first_host(list: &str) -> Option<String> {
    expand(list)?.into_iter().next()
}

/// Splits at the commas outside brackets.
fn split_top_level(list: &str) -> Option<Vec<&str>> {
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1)?,
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return None;
    }
    items.push(&list[start..]);
    Some(items)
}

/// Expands one name with zero or more bracket groups onto `hosts`.
fn expand_item(item: &str, hosts: &mut Vec<String>) -> Option<()> {
    let item = item.trim();
    if item.is_empty() {
        return None;
    }
    let Some(open) = item.find('[') else {
        if item.contains(']') {
            return None;
        }
        hosts.push(item.to_string());
        return Some(());
    };
    let close = open + item[open..].find(']')?;
    let (prefix, ranges, rest) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
    for range in ranges.split(',') {
        let (low, high) = range.split_once('-').unwrap_or((range, range));
        let width = low.len();
        let (start, end): (u64, u64) = (low.trim().parse().ok()?, high.trim().parse().ok()?);
        if end < start {
            return None;
        }
        for n in start..=end {
            expand_item(&format!("{prefix}{n:0width$}{rest}"), hosts)?;
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_lists_and_padding() {
        assert_eq!(
            expand("node[01-03],gpu5"),
            Some(vec![
                "node01".into(),
                "node02".into(),
                "node03".into(),
                "gpu5".into()
            ])
        );
        assert_eq!(
            expand("n[8-10,12]"),
            Some(vec!["n8".into(), "n9".into(), "n10".into(), "n12".into()])
        );
        assert_eq!(
            expand("r[1-2]n[1-2]"),
            Some(vec![
                "r1n1".into(),
                "r1n2".into(),
                "r2n1".into(),
                "r2n2".into()
            ])
        );
        assert_eq!(first_host("gpu5"), Some("gpu5".into()));
        assert_eq!(first_host("node[007-009]"), Some("node007".into()));
    }

    #[test]
    fn malformed_lists_are_refused() {
        for bad in ["", "a[1-", "a]1", "a[3-1]", "a[x]", "a,,b", "a[1-2"] {
            assert_eq!(expand(bad), None, "{bad:?}");
        }
    }
}
