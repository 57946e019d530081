use super::*;

#[test]
fn sizes_stay_whole_when_wrapped() {
    let mut o = String::new();
    let text = format!("{} 8.00 GiB", "x".repeat(WIDTH - 6));
    wrap(&mut o, &text, "  ");
    assert_eq!(o, format!("{}\n  8.00 GiB\n", "x".repeat(WIDTH - 6)));
}
