//! The chart is well-formed XML, holds every point, and labels its axes readably.

use super::*;
use crate::schedule::LrSchedule;
use serde_json::json;

/// A tiny XML well-formedness check: balanced, properly nested tags, quoted attributes, valid
/// entities, one root element. Returns the number of elements.
fn check_xml(text: &str) -> Result<usize, String> {
    let mut stack: Vec<&str> = Vec::new();
    let mut elements = 0;
    let mut roots = 0;
    let mut rest = text;
    while let Some(open) = rest.find('<') {
        let content = &rest[..open];
        check_text(content)?;
        if stack.is_empty() && !content.trim().is_empty() {
            return Err(format!("text outside the root: {content:?}"));
        }
        let close = rest[open..].find('>').ok_or("unterminated tag")? + open;
        let tag = &rest[open + 1..close];
        rest = &rest[close + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            let top = stack
                .pop()
                .ok_or_else(|| format!("</{name}> closes nothing"))?;
            if top != name.trim() {
                return Err(format!("</{name}> closes <{top}>"));
            }
            continue;
        }
        let (body, self_closing) = match tag.strip_suffix('/') {
            Some(body) => (body, true),
            None => (tag, false),
        };
        let name_end = body.find(|c: char| c.is_whitespace()).unwrap_or(body.len());
        let name = &body[..name_end];
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_alphanumeric() || "-_:.".contains(c))
        {
            return Err(format!("bad element name {name:?}"));
        }
        check_attributes(&body[name_end..])?;
        if stack.is_empty() {
            roots += 1;
        }
        elements += 1;
        if !self_closing {
            stack.push(name);
        }
    }
    check_text(rest)?;
    if !rest.trim().is_empty() {
        return Err("text after the root".to_string());
    }
    if let Some(open) = stack.last() {
        return Err(format!("<{open}> never closed"));
    }
    if roots != 1 {
        return Err(format!("{roots} root elements"));
    }
    Ok(elements)
}

fn check_text(text: &str) -> Result<(), String> {
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        let semi = rest[amp..].find(';').ok_or("& without ;")? + amp;
        let entity = &rest[amp + 1..semi];
        let known = ["amp", "lt", "gt", "quot", "apos"].contains(&entity)
            || (entity.starts_with('#')
                && entity[1..]
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() || c == 'x'));
        if !known {
            return Err(format!("unknown entity &{entity};"));
        }
        rest = &rest[semi + 1..];
    }
    Ok(())
}

fn check_attributes(mut text: &str) -> Result<(), String> {
    let mut seen = Vec::new();
    loop {
        text = text.trim_start();
        if text.is_empty() {
            return Ok(());
        }
        let eq = text
            .find('=')
            .ok_or_else(|| format!("attribute without value: {text:?}"))?;
        let name = text[..eq].trim();
        if name.is_empty() || name.contains(char::is_whitespace) || seen.contains(&name) {
            return Err(format!("bad or repeated attribute {name:?}"));
        }
        seen.push(name);
        let after = text[eq + 1..].trim_start();
        let quote = after.chars().next().ok_or("missing attribute value")?;
        if quote != '"' && quote != '\'' {
            return Err(format!("unquoted attribute {name}"));
        }
        let end = after[1..].find(quote).ok_or("unterminated attribute")? + 1;
        let value = &after[1..end];
        if value.contains('<') {
            return Err(format!("< inside attribute {name}"));
        }
        check_text(value)?;
        text = &after[end + 1..];
    }
}

/// The `points` of the polyline of class `class`, if any.
fn polyline_points(svg: &str, class: &str) -> Option<Vec<(f64, f64)>> {
    let start = svg.find(&format!(r#"<polyline class="{class}""#))?;
    let tag = &svg[start..start + svg[start..].find("/>")?];
    let points = tag.split(r#"points=""#).nth(1)?.trim_end_matches('"');
    Some(
        points
            .split_whitespace()
            .map(|pair| {
                let (x, y) = pair.split_once(',').expect("x,y");
                (x.parse().expect("x"), y.parse().expect("y"))
            })
            .collect(),
    )
}

/// A series of (step, value) points.
type Series = Vec<(u64, f64)>;

fn one_cycle_series(steps: u64) -> (Series, Series) {
    let params = json!({"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 40});
    let (schedule, _) =
        LrSchedule::from_params("OneCycle", params.as_object().expect("object"), 1e-3)
            .expect("built");
    let lr = (0..steps).map(|s| (s, schedule.lr_at(s))).collect();
    let momentum = (0..steps)
        .map(|s| (s, schedule.momentum_at(s).expect("cycled").0))
        .collect();
    (lr, momentum)
}

#[test]
fn chart_with_momentum_is_well_formed_and_complete() {
    let (lr, momentum) = one_cycle_series(120);
    let svg = lr_curve_svg(&lr, Some(&momentum), "OneCycle");
    let elements = check_xml(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
    assert!(elements > 20);
    let lr_points = polyline_points(&svg, "lr").expect("lr line");
    assert_eq!(lr_points.len(), 120);
    assert_eq!(
        polyline_points(&svg, "momentum")
            .expect("momentum line")
            .len(),
        120
    );
    assert!(svg.contains(r#"class="momentum-ticks""#));
    // Every point lies inside the plotting area.
    for (x, y) in lr_points {
        assert!((LEFT..=WIDTH - RIGHT).contains(&x) && (TOP..=HEIGHT - BOTTOM).contains(&y));
    }
}

#[test]
fn chart_without_momentum_has_no_second_axis() {
    let (lr, _) = one_cycle_series(30);
    let svg = lr_curve_svg(&lr, None, "lr");
    check_xml(&svg).expect("well-formed");
    assert!(polyline_points(&svg, "momentum").is_none());
    assert!(!svg.contains("momentum-ticks"));
}

#[test]
fn axis_labels_are_short_and_consistent() {
    let points: Vec<(u64, f64)> = (0..=1000).map(|s| (s, 1e-3 * s as f64 / 1000.0)).collect();
    let svg = lr_curve_svg(&points, None, "warmup");
    check_xml(&svg).expect("well-formed");
    for label in [">0<", ">0.0002<", ">0.0010<", ">1000<", ">step<"] {
        assert!(svg.contains(label), "missing {label}");
    }
    assert_eq!(value_label(3e-5, 1e-5, false), "3e-5");
    assert_eq!(value_label(1.2e-5, 2e-6, false), "1.2e-5");
    assert_eq!(value_label(0.85, 0.02, true), "0.85");
    assert_eq!(step_label(12000.0, 20000.0), "12k");
    assert_eq!(step_label(5000.0, 20000.0), "5k");
    assert_eq!(step_label(1_500_000.0, 2e6), "1.5M");
    assert_eq!(step_label(250.0, 1000.0), "250");
    assert_eq!(nice_step(0.00021), 0.0005);
    assert!(!uses_decimals(0.0, 5e-5, 1e-5));
}

#[test]
fn titles_are_escaped_and_bad_points_left_out() {
    let points = [(0, 0.1), (1, f64::NAN), (2, 0.3), (3, f64::INFINITY)];
    let svg = lr_curve_svg(&points, None, r#"a < b & "c""#);
    check_xml(&svg).unwrap_or_else(|e| panic!("{e}"));
    assert!(svg.contains("a &lt; b &amp; &quot;c&quot;"));
    assert_eq!(polyline_points(&svg, "lr").expect("line").len(), 2);
}

#[test]
fn empty_and_flat_series_still_draw() {
    let svg = lr_curve_svg(&[], None, "nothing");
    check_xml(&svg).expect("well-formed");
    assert!(svg.contains("no data"));
    let flat = lr_curve_svg(&[(5, 0.0), (6, 0.0)], None, "flat");
    check_xml(&flat).expect("well-formed");
    assert_eq!(polyline_points(&flat, "lr").expect("line").len(), 2);
}

#[test]
fn the_checker_rejects_broken_xml() {
    assert!(check_xml("<a><b></a></b>").is_err());
    assert!(check_xml("<a x=1/>").is_err());
    assert!(check_xml("<a>&nbsp;</a>").is_err());
    assert!(check_xml("<a/><b/>").is_err());
    assert!(check_xml("<a><b/></a>").is_ok());
}
