use super::build::letters;
use super::natural::natural_key;

#[test]
fn letters_run_past_z() {
    assert_eq!(letters(0), "A");
    assert_eq!(letters(25), "Z");
    assert_eq!(letters(26), "AA");
    assert_eq!(letters(27), "AB");
}

#[test]
fn natural_order_compares_numbers() {
    let mut names = vec!["neurondevice10", "neurondevice2", "neurondevice1"];
    names.sort_by_key(|n| natural_key(n));
    assert_eq!(names, ["neurondevice1", "neurondevice2", "neurondevice10"]);
}
