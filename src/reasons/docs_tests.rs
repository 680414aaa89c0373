//! docs/troubleshooting.md against the reasons table, both ways: every reason of a kind is in that
//! kind's table and every Warning reason has its section; the page names no reason the code does
//! not have. Below its marker the page is generated from the table ([`render`]); a failure prints
//! what belongs there.

use std::collections::BTreeSet;

use super::{Kind, Reason, Severity};

const PAGE: &str = include_str!("../../docs/troubleshooting.md");

/// The line after which the page is generated.
const MARKER: &str = "<!-- Generated from src/reasons/table.rs; src/reasons/docs_tests.rs checks it. -->";

/// The generated part of the page: a section per Warning reason, then a table per kind.
fn render() -> String {
    let mut out = String::from("\n\n## Warning reasons\n");
    for reason in Reason::ALL.iter().filter(|r| r.severity() == Severity::Warning) {
        let d = reason.definition();
        let kinds: Vec<&str> = d.kinds.iter().map(|k| k.as_str()).collect();
        out += &format!("\n### `{reason}`\n\n{}: {}. **What to do**: {}.\n", kinds.join(", "), d.meaning, d.action);
    }
    out += "\n## Every reason, by kind\n";
    for kind in Kind::ALL {
        out += &format!("\n### {}\n\n| Reason | Type | Meaning |\n|---|---|---|\n", kind.as_str());
        for reason in Reason::ALL.iter().filter(|r| r.applies_to(kind)) {
            let d = reason.definition();
            out += &format!("| `{reason}` | {} | {} |\n", d.severity.as_str(), d.meaning);
        }
    }
    out
}

/// The page's section `heading` (to the next heading of its level or above).
fn section<'a>(page: &'a str, heading: &str) -> &'a str {
    let level = heading.split(' ').next().unwrap_or_default();
    let Some((_, rest)) = page.split_once(&format!("\n{heading}\n")) else { return "" };
    let ends: Vec<String> = (2..=level.len()).map(|n| format!("\n{} ", "#".repeat(n))).collect();
    let end = ends.iter().filter_map(|e| rest.find(e.as_str())).min().unwrap_or(rest.len());
    &rest[..end]
}

/// The reasons a kind's table lists, with their Type cell.
fn table(kind: Kind) -> Vec<(String, String)> {
    let body = section(PAGE, &format!("### {}", kind.as_str()));
    body.lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells[1].trim_matches('`').to_string(), cells[2].to_string())
        })
        .collect()
}

/// The reasons with a section under "## Warning reasons".
fn warning_sections() -> BTreeSet<String> {
    let body = section(PAGE, "## Warning reasons");
    body.lines().filter_map(|l| l.strip_prefix("### `")).map(|l| l.trim_end_matches('`').to_string()).collect()
}

fn names(reasons: impl Iterator<Item = Reason>) -> BTreeSet<String> {
    reasons.map(|r| r.as_str().to_string()).collect()
}

#[test]
fn every_reason_is_in_its_kinds_table_and_the_tables_name_only_reasons_in_code() {
    let mut problems = Vec::new();
    for kind in Kind::ALL {
        let code = names(Reason::ALL.iter().copied().filter(|r| r.applies_to(kind)));
        let rows = table(kind);
        let page: BTreeSet<String> = rows.iter().map(|(name, _)| name.clone()).collect();
        let missing: Vec<&String> = code.difference(&page).collect();
        let unknown: Vec<&String> = page.difference(&code).collect();
        if !missing.is_empty() {
            problems.push(format!("### {} lacks {missing:?}", kind.as_str()));
        }
        if !unknown.is_empty() {
            problems.push(format!("### {} lists reasons the code has not for this kind: {unknown:?}", kind.as_str()));
        }
        for (name, type_) in &rows {
            if let Some(reason) = Reason::parse(name).filter(|r| r.severity().as_str() != type_) {
                problems.push(format!("{name} is {}, not {type_}", reason.severity().as_str()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/troubleshooting.md:\n{}\n\nexpected below its marker:\n{}",
        problems.join("\n"),
        render()
    );
}

#[test]
fn every_warning_reason_has_its_section_and_no_other_reason_has_one() {
    let code = names(Reason::ALL.iter().copied().filter(|r| r.severity() == Severity::Warning));
    let page = warning_sections();
    let missing: Vec<&String> = code.difference(&page).collect();
    let unknown: Vec<&String> = page.difference(&code).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/troubleshooting.md, ## Warning reasons: missing {missing:?}, not Warning reasons in code {unknown:?}\n\nexpected below its marker:\n{}",
        render()
    );
}

#[test]
fn the_page_below_its_marker_is_what_the_table_generates() {
    let Some((_, generated)) = PAGE.split_once(MARKER) else {
        panic!("docs/troubleshooting.md lacks the line {MARKER}");
    };
    assert!(generated == render(), "docs/troubleshooting.md below its marker must read:\n{}", render());
}

#[test]
fn the_page_is_read_as_it_is_written() {
    let page = "# T\n\n## Warning reasons\n\n### `A`\n\nx\n\n## Every reason, by kind\n\n### Queue\n\n| Reason | Type | Meaning |\n|---|---|---|\n| `B` | Normal | y |\n\n### Tunnel\n";
    assert_eq!(section(page, "### `A`").trim(), "x");
    assert!(section(page, "## Warning reasons").contains("### `A`"));
    assert!(!section(page, "## Warning reasons").contains("Queue"));
    assert!(section(page, "### Queue").contains("| `B` | Normal | y |"));
    assert_eq!(section(page, "### Service"), "");
}
