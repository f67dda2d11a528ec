//! The README keeps its promises: every diagnostic code is documented there.

use dsplan_planner::diagnostics::Code;

#[test]
fn every_diagnostic_code_is_documented() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    for code in Code::ALL {
        assert!(
            readme.contains(&format!("| `{code}` |")),
            "README.md does not document `{code}`"
        );
    }
}
