//! The patch attacks, on an object and on its status: JSON patch `copy` and `move` of the value
//! an attacker is after into the name, a label or an annotation (the API server names the
//! object, and validation quotes the label, in its error: a read through a write), `test` as an
//! equality oracle, merge, strategic merge and apply patches that overwrite or redirect, and
//! owner reference and finalizer injection (the garbage collector deletes what a forged owner
//! does not back; a finalizer pins an object and its namespace).

use hyper::Method;
use serde_json::{Value, json};

use super::attempts::{Attempt, DRY_RUN};
use super::victims::{Victim, overwrite, status_overwrite};
use super::wire::{Call, JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH};

/// Two patches that differ only in a guess of the victim's value: a right and a wrong guess must
/// be answered alike (`guesses` are masked before comparing).
#[derive(Debug, Clone)]
pub struct Oracle {
    pub what: String,
    pub right: Call,
    pub wrong: Call,
    pub guesses: [String; 2],
}

pub const FOREIGN_FINALIZER: &str = "attacks.example.com/pin";

/// Every patch attack on `v` (`sub`: `Some("status")` for its status), with `owners` to inject.
pub fn patches(v: &Victim, sub: Option<&str>, owners: &[(String, Value)]) -> (Vec<Attempt>, Vec<Oracle>) {
    let path = v.path(sub);
    let on = |what: &str| match sub {
        Some(s) => format!("{what} (through /{s})"),
        None => what.to_string(),
    };
    let json_patch = |ops: Value| Call::new(Method::PATCH, &path).with(JSON_PATCH, ops);
    let mut list = Vec::new();
    let has_annotations = v.template["metadata"]["annotations"].is_object();
    for (target, into) in [
        ("/metadata/name", "the name"),
        ("/metadata/labels/stolen", "a label"),
        ("/metadata/annotations/stolen", "an annotation"),
    ] {
        for op in ["copy", "move"] {
            let mut ops = vec![json!({"op": op, "from": v.at, "path": target})];
            if target.starts_with("/metadata/annotations") && !has_annotations {
                ops.insert(0, json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
            }
            let what = on(&format!("JSON patch {op} {} into {into}", v.at));
            list.extend(Attempt::write(what, json_patch(Value::Array(ops))).and_dry_run());
        }
    }
    let merge = Call::new(Method::PATCH, &path).with(MERGE_PATCH, overwrite(v));
    list.extend(Attempt::write(on("merge patch overwriting it"), merge).and_dry_run());
    let strategic = Call::new(Method::PATCH, &path).with(STRATEGIC_PATCH, overwrite(v));
    list.push(Attempt::write(on("strategic merge patch overwriting it"), strategic));
    if sub.is_some() {
        let status = Call::new(Method::PATCH, &path).with(MERGE_PATCH, status_overwrite(v.kind));
        list.extend(Attempt::write(on("merge patch of its status"), status).and_dry_run());
    }
    for (whose, owner) in owners {
        let ops = json!([{"op": "add", "path": "/metadata/ownerReferences", "value": [owner]}]);
        list.push(Attempt::write(on(&format!("owner reference injection ({whose})")), json_patch(ops)));
    }
    let ops = json!([{"op": "add", "path": "/metadata/finalizers", "value": [FOREIGN_FINALIZER]}]);
    list.push(Attempt::write(on("finalizer injection (JSON patch)"), json_patch(ops)));
    let pin = json!({"metadata": {"finalizers": [FOREIGN_FINALIZER]}});
    list.push(Attempt::write(
        on("finalizer injection (merge patch)"),
        Call::new(Method::PATCH, &path).with(MERGE_PATCH, pin),
    ));
    (list, oracles(v, &path, &on))
}

/// `test` of the victim's value, right and wrong: alone, followed by a write (a dry run), and
/// followed by a write for real.
fn oracles(v: &Victim, path: &str, on: &dyn Fn(&str) -> String) -> Vec<Oracle> {
    let right = v.value.clone();
    let wrong = match &right {
        Value::String(s) => json!(format!("{s}x")),
        other => json!(format!("{other}x")),
    };
    let guess = |value: &Value| value.as_str().map_or_else(|| value.to_string(), str::to_string);
    let guesses = [guess(&right), guess(&wrong)];
    let label = json!({"op": "add", "path": "/metadata/labels/attacks.skyport.dev~1guessed", "value": "true"});
    let forms: [(&str, bool, bool); 3] =
        [("alone", false, true), ("then a write, dry run", true, true), ("then a write", true, false)];
    forms
        .into_iter()
        .map(|(form, write, dry)| {
            let call = |value: &Value| {
                let mut ops = vec![json!({"op": "test", "path": v.at, "value": value})];
                if write {
                    ops.push(label.clone());
                }
                let call = Call::new(Method::PATCH, path).with(JSON_PATCH, Value::Array(ops));
                if dry { call.query(DRY_RUN) } else { call }
            };
            Oracle {
                what: on(&format!("JSON patch test of {} as an oracle ({form})", v.at)),
                right: call(&right),
                wrong: call(&wrong),
                guesses: guesses.clone(),
            }
        })
        .collect()
}
