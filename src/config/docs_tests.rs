//! docs/operations.md's flag table against `skyport run --help`: every flag (and the variable
//! that sets it) is documented, and the table names no flag the binary does not have.

use std::collections::BTreeSet;

use clap::CommandFactory;

use super::Cli;

const OPERATIONS: &str = include_str!("../../docs/operations.md");

/// (`--flag`, `VARIABLE`) of every `skyport run` flag.
fn flags() -> Vec<(String, Option<String>)> {
    let cli = Cli::command();
    let run = cli.find_subcommand("run").expect("skyport run");
    run.get_arguments()
        .filter_map(|a| Some((format!("--{}", a.get_long()?), a.get_env().map(|e| e.to_string_lossy().into_owned()))))
        .filter(|(long, _)| long != "--help")
        .collect()
}

/// The rows of the table under "## Flags": (first cell, second cell).
fn rows() -> Vec<(String, String)> {
    let table = OPERATIONS.split("## Flags").nth(1).expect("a Flags section").split("\n## ").next().unwrap();
    table
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').collect();
            (cells[1].to_string(), cells[2].to_string())
        })
        .collect()
}

/// The backquoted words of a cell; `_MAX`-style suffixes expand against the first variable.
fn quoted(cell: &str) -> Vec<String> {
    cell.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

#[test]
fn every_run_flag_and_its_variable_is_in_the_operations_table() {
    let rows = rows();
    let mut missing = Vec::new();
    for (flag, env) in flags() {
        let Some((_, vars)) = rows.iter().find(|(flags, _)| quoted(flags).contains(&flag)) else {
            missing.push(flag);
            continue;
        };
        let Some(env) = env else { continue };
        let vars = quoted(vars);
        let first = vars.first().cloned().unwrap_or_default();
        let expanded = |v: &String| match v.strip_prefix('_') {
            // `SKYPORT_TUNNEL_ERROR_BACKOFF_MIN` / `_MAX`: the suffix replaces the first one's last word.
            Some(_) => format!("{}{}", first.rsplit_once('_').map(|(stem, _)| stem).unwrap_or(""), v),
            None => v.clone(),
        };
        if !vars.iter().map(expanded).any(|v| v == env) {
            missing.push(format!("{flag} ({env})"));
        }
    }
    assert!(missing.is_empty(), "docs/operations.md, ## Flags, does not document: {missing:?}");
}

#[test]
fn the_operations_table_names_only_flags_the_binary_has() {
    let known: BTreeSet<String> = flags().into_iter().map(|(flag, _)| flag).collect();
    let unknown: Vec<String> =
        rows().iter().flat_map(|(flags, _)| quoted(flags)).filter(|f| !known.contains(f)).collect();
    assert!(unknown.is_empty(), "docs/operations.md documents flags `skyport run` does not have: {unknown:?}");
}
