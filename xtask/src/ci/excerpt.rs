//! What `cargo xtask ci` repeats at the end of its output about a failed
//! leg, so that the last lines of a CI log say why it failed.

/// The lines of a failed leg's log that say why: each failed test's section
/// of cargo test's `failures:` block, then the log's last lines (the error
/// of a leg that failed before or after its tests). Long lines are cut; a
/// line already shown is not shown again (a failed bring-up repeats its error,
/// and the log lines in it, under every test), except the `---- test ----`
/// headers, which name the tests that failed.
pub(super) fn failure_excerpt(log: &str) -> Vec<String> {
    const DETAIL_LINES: usize = 60;
    const TAIL_LINES: usize = 12;
    const LINE_CHARS: usize = 1500;
    let cut = |l: &str| {
        if l.chars().count() > LINE_CHARS {
            format!("{}…", l.chars().take(LINE_CHARS).collect::<String>())
        } else {
            l.to_string()
        }
    };
    let lines: Vec<&str> = log.lines().collect();
    let mut out = Vec::new();
    // cargo test prints `failures:` twice: the details, then the names.
    let marks: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.trim_end() == "failures:")
        .map(|(i, _)| i)
        .collect();
    let mut details_end = 0;
    for pair in marks.chunks(2) {
        let from = pair[0] + 1;
        let to = pair.get(1).copied().unwrap_or(lines.len());
        let mut seen = std::collections::HashSet::new();
        let section: Vec<&str> = lines[from..to]
            .iter()
            .copied()
            .filter(|l| !l.trim().is_empty())
            .filter(|l| (l.starts_with("---- ") && l.ends_with(" ----")) || seen.insert(*l))
            .collect();
        out.extend(section.iter().take(DETAIL_LINES).map(|l| cut(l)));
        if section.len() > DETAIL_LINES {
            out.push(format!("… {} more lines", section.len() - DETAIL_LINES));
        }
        details_end = to;
    }
    let tail_from = lines.len().saturating_sub(TAIL_LINES).max(details_end);
    out.extend(lines[tail_from..].iter().map(|l| cut(l)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_excerpt_shows_each_failed_test_and_the_error() {
        let log = "running 3 tests\n\
            test a ... ok\n\
            test b ... FAILED\n\
            noise\n\
            failures:\n\
            \n\
            ---- b ----\n\
            pod x not Running after 5s\n\
            \n\
            failures:\n    b\n\
            test result: FAILED. 1 passed; 1 failed\n\
            Error: end-to-end tests failed\n";
        let ex = failure_excerpt(log);
        assert_eq!(ex[0], "---- b ----");
        // The same error under two tests: shown once, both tests named.
        let twice = "failures:\n---- a ----\nbring-up failed:\n    why\n\
            ---- b ----\nbring-up failed:\n    why\nfailures:\n    a\n    b\n";
        assert_eq!(
            failure_excerpt(twice)[..4],
            ["---- a ----", "bring-up failed:", "    why", "---- b ----"]
        );
        assert_eq!(ex[1], "pod x not Running after 5s");
        assert!(ex.iter().any(|l| l == "Error: end-to-end tests failed"));
        assert!(!ex.iter().any(|l| l == "noise"));
        // A leg that failed before any test: its last lines.
        let early =
            (0..30).map(|i| format!("line {i}\n")).collect::<String>() + "Error: bring-up\n";
        let ex = failure_excerpt(&early);
        assert_eq!(ex.last().unwrap(), "Error: bring-up");
        assert_eq!(ex.len(), 12);
        let long = "x".repeat(5000);
        assert!(failure_excerpt(&long)[0].chars().count() <= 1501);
    }
}
