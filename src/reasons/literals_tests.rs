//! No reason is spelled as a string literal outside the table: code names [`Reason`] variants,
//! so a reason's string, kinds and severity have one definition. Test code may spell them (it
//! checks the strings users and alerts see); non-test code is parsed with `syn`, so comments,
//! doc text and longer strings that merely contain a reason's name do not count.

use std::path::{Path, PathBuf};

use syn::visit::Visit;

use super::Reason;

/// String literals equal to a reason's name that are not reasons: (file under src/, literal, why).
const NOT_REASONS: &[(&str, &str, &str)] = &[];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if path.is_file() && name.ends_with(".rs") && !name.ends_with("tests.rs") {
            out.push(path);
        }
    }
}

/// Every non-test `.rs` file under src/, except the reasons table itself and the test fakes.
fn files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut dirs = vec![root.clone()];
    let mut i = 0;
    while i < dirs.len() {
        let dir = dirs[i].clone();
        for entry in std::fs::read_dir(&dir).expect("src/ is readable") {
            let path = entry.expect("a directory entry").path();
            let skipped = path.ends_with("reasons") || path.ends_with("testing");
            if path.is_dir() && !skipped {
                dirs.push(path);
            }
        }
        i += 1;
    }
    let mut out = Vec::new();
    for dir in &dirs {
        rust_files(dir, &mut out);
    }
    out
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("test")
            || (a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test"))
    })
}

/// What a file spells that it should not: reasons as literals, and literal reasons passed to
/// `Condition::new`.
#[derive(Default)]
struct Finder {
    found: Vec<String>,
}

impl<'a> Visit<'a> for Finder {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !is_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        if !is_test(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_lit_str(&mut self, s: &'a syn::LitStr) {
        let value = s.value();
        if Reason::parse(&value).is_some() {
            self.found.push(format!("the literal {value:?}"));
        }
    }

    fn visit_expr_call(&mut self, call: &'a syn::ExprCall) {
        let callee = match &*call.func {
            syn::Expr::Path(p) => p.path.segments.iter().map(|s| s.ident.to_string()).collect::<Vec<_>>().join("::"),
            _ => String::new(),
        };
        if callee.ends_with("Condition::new")
            && let Some(syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. })) = call.args.iter().nth(2)
        {
            self.found.push(format!("Condition::new with the literal reason {:?}", s.value()));
        }
        syn::visit::visit_expr_call(self, call);
    }
}

fn spelled(source: &str) -> Vec<String> {
    let file = syn::parse_file(source).expect("parses");
    let mut finder = Finder::default();
    finder.visit_file(&file);
    finder.found
}

#[test]
fn no_reason_is_spelled_outside_the_table() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = files();
    assert!(files.len() > 50, "found only {} files under src/", files.len());
    let mut found = Vec::new();
    for path in files {
        let relative = path.strip_prefix(root).unwrap_or(&path).to_string_lossy().into_owned();
        let source = std::fs::read_to_string(&path).expect("readable");
        for what in spelled(&source) {
            let allowed =
                NOT_REASONS.iter().any(|(file, lit, _)| *file == relative && what.contains(&format!("{lit:?}")));
            if !allowed {
                found.push(format!("{relative}: {what}"));
            }
        }
    }
    assert!(found.is_empty(), "use crate::reasons::Reason instead of:\n{}", found.join("\n"));
}

#[test]
fn the_finder_sees_literals_but_not_tests_comments_or_longer_strings() {
    let source = r#"
        // "InvalidSpec" in a comment
        /// "InvalidSpec" in a doc
        fn report() { publish("ServiceNotServed", "InvalidSpec is bad"); }
        fn ready() { Condition::new("Ready", ConditionStatus::False, "SomethingNew", ""); }
        #[cfg(test)]
        mod tests { fn t() { assert_eq!(r, "InvalidSpec"); } }
        #[test]
        fn t() { assert_eq!(r, "NotAllowed"); }
    "#;
    assert_eq!(
        spelled(source),
        ["the literal \"ServiceNotServed\"", "Condition::new with the literal reason \"SomethingNew\""]
    );
}
