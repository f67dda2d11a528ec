//! Where a run's final parameters differ from the CPU backend's beyond a tolerance, tensor by
//! tensor: shared by the CUDA tests on the device (`cuda_train.rs`) and on the host interpreter
//! (`cuda_program_on_host.rs`), which print it before they assert.

use dsplan_executor::model::ModelConfig;

/// Per tensor of `model`, how many elements of `got` (the `label` run's: "gpu", "host") lie
/// beyond `|got - cpu| <= rel |cpu| + tol`, and the worst of them with its initial value.
pub fn beyond_tolerance(
    label: &str,
    model: &ModelConfig,
    initial: &[f32],
    got: &[f32],
    cpu: &[f32],
    (rel, tol): (f64, f64),
) -> String {
    let layout = model.layout();
    let mut lines = Vec::new();
    for entry in layout.table().entries() {
        let range = entry.span.offset..entry.span.end();
        let mut beyond = 0usize;
        let mut worst: Option<(f64, usize)> = None;
        for i in range.clone() {
            let (g, c) = (f64::from(got[i]), f64::from(cpu[i]));
            let excess = (g - c).abs() - rel * c.abs();
            if excess > tol || excess.is_nan() {
                beyond += 1;
                if worst.is_none_or(|(w, _)| excess > w || excess.is_nan()) {
                    worst = Some((excess, i));
                }
            }
        }
        if let Some((excess, i)) = worst {
            lines.push(format!(
                "  {}: {beyond} of {} beyond; worst [{}] {label} {:e} cpu {:e} initial {:e} (excess {excess:.3e})",
                entry.name,
                range.len(),
                i - range.start,
                got[i],
                cpu[i],
                initial[i],
            ));
        }
    }
    if lines.is_empty() {
        "  every tensor within tolerance".to_string()
    } else {
        lines.join("\n")
    }
}
