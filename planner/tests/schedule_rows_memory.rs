//! `dsplan schedule --format json` writes every step in memory that does not grow with the step
//! count (issue 14: 10^7 steps took 6.2 GB when the list was built first), and its chart is
//! drawn from a bounded number of points. Measured with a counting allocator: the most bytes
//! live at once while 200,000 steps are written (a built list would hold about 120 MB).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use dsplan_planner::schedule::rows::{curve, write_json_rows};
use dsplan_planner::schedule::{BetasSupport, LrSchedule, OptimizerGroups};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(now, Ordering::SeqCst);
        // SAFETY: the caller's layout is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn one_cycle() -> LrSchedule {
    let params = serde_json::json!({
        "cycle_min_lr": 0.0001, "cycle_max_lr": 0.001, "cycle_first_step_size": 1000,
        "decay_lr_rate": 0.001, "decay_step_size": 100
    });
    let groups = OptimizerGroups {
        lrs: &[0.001],
        betas: BetasSupport::Betas,
    };
    let params = params.as_object().cloned().unwrap_or_default();
    LrSchedule::from_params_for("OneCycle", &params, groups)
        .expect("OneCycle builds")
        .0
}

/// Counts the bytes written without keeping them.
struct CountingSink(u64);

impl std::io::Write for CountingSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn json_rows_and_the_chart_take_memory_that_does_not_grow_with_the_steps() {
    let schedule = one_cycle();
    let steps = 200_000;

    let before = LIVE.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    let mut sink = CountingSink(0);
    write_json_rows(&schedule, steps, &mut sink).expect("written");
    let json_peak = PEAK.load(Ordering::SeqCst) - before;
    assert!(sink.0 > 8_000_000, "every row written: {} bytes", sink.0);
    assert!(
        json_peak < 64 * 1024,
        "{json_peak} bytes live at once while writing {} bytes",
        sink.0
    );

    let before = LIVE.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    let chart = curve(&schedule, steps, 4_000);
    let chart_peak = PEAK.load(Ordering::SeqCst) - before;
    assert!(chart.lr.len() <= 4_000, "{}", chart.lr.len());
    assert!(
        chart_peak < 512 * 1024,
        "{chart_peak} bytes live at once for a {}-point chart",
        chart.lr.len()
    );
}
