//! Runs attacks on a victim and judges each: no planted secret in any answer, no write admitted
//! (but where a residue admits it), the victim unchanged (resourceVersion and content) and not
//! deleted, a right and a wrong guess answered alike. A victim an attack changed is recorded and
//! put back, so that every later attack is judged on its own.

use std::sync::Mutex;

use hyper::Method;
use kube::Client;
use serde_json::Value;

use super::attempts::{Attempt, DRY_RUN};
use super::grants::Grant;
use super::patches::Oracle;
use super::residues;
use super::victims::{self, Victim};
use super::wire::{Answer, Call};

pub struct Judge {
    pub install: String,
    pub admin: Client,
    pub sa: Client,
    pub grants: Vec<Grant>,
    /// (victim, string) for every string no answer may contain: the marker of each victim the
    /// grants do not make readable by a residue, and its base64.
    secrets: Vec<(String, String)>,
    failures: Mutex<Vec<String>>,
}

impl Judge {
    pub fn new(install: &str, admin: Client, sa: Client, grants: Vec<Grant>, victims: &[Victim]) -> Judge {
        let secrets = victims
            .iter()
            .filter(|v| !residues::readable(&grants, v))
            .flat_map(|v| v.secrets().into_iter().map(|s| (v.label(), s)))
            .collect();
        Judge { install: install.to_string(), admin, sa, grants, secrets, failures: Mutex::default() }
    }

    pub fn fail(&self, about: &str, what: &str, outcome: impl std::fmt::Display) {
        let line = format!("[{}] {about}: {what}: {outcome}", self.install);
        self.failures.lock().unwrap().push(line);
    }

    pub fn failures(self) -> Vec<String> {
        self.failures.into_inner().unwrap()
    }

    /// Fails for every secret in `answer` but those in `except` (the guess an oracle sent).
    fn scan(&self, v: &Victim, what: &str, answer: &Answer, except: &[String]) {
        for (whose, secret) in &self.secrets {
            if !except.contains(secret) && answer.body.contains(secret.as_str()) {
                self.fail(&v.label(), what, format!("LEAKS the value of {whose}: {}", answer.brief()));
            }
        }
    }

    /// Every attempt, then every oracle, on `v`.
    pub async fn attack(&self, v: &Victim, attempts: Vec<Attempt>, oracles: Vec<Oracle>) {
        let mut before = victims::get(&self.admin, v).await.unwrap_or_else(|| panic!("{} planted", v.label()));
        let status_written = residues::status_written(&self.grants, v);
        for a in attempts {
            let answer = a.call.at_version_of(&before).send(&self.sa).await;
            self.scan(v, &a.what, &answer, &[]);
            let residue = a.status && status_written;
            if a.write && answer.admitted() {
                if !residue {
                    self.fail(&v.label(), &a.what, format!("admitted: {}", answer.brief()));
                }
                self.remove_created(&a, &answer).await;
            }
            if a.write {
                before = self.unchanged(v, before, &a.what, residue).await;
            }
        }
        let readable = residues::readable(&self.grants, v);
        for o in oracles {
            let right = o.right.send(&self.sa).await;
            before = self.unchanged(v, before, &o.what, false).await;
            let wrong = o.wrong.send(&self.sa).await;
            before = self.unchanged(v, before, &o.what, false).await;
            self.scan(v, &o.what, &right, &v.secrets());
            self.scan(v, &o.what, &wrong, &[]);
            let masked =
                |a: &Answer| (a.status, a.body.replace(&o.guesses[1], "<guess>").replace(&o.guesses[0], "<guess>"));
            if !readable && masked(&right) != masked(&wrong) {
                let outcome = format!("ANSWERS DIFFER: right guess {} / wrong guess {}", right.brief(), wrong.brief());
                self.fail(&v.label(), &o.what, outcome.replace(&o.guesses[0], "<right>"));
            }
        }
    }

    /// An object an attack created for real (not a dry run) is deleted again.
    async fn remove_created(&self, a: &Attempt, answer: &Answer) {
        if a.call.method != Method::POST || a.call.uri.contains(DRY_RUN) {
            return;
        }
        let Some(name) = answer.json().and_then(|o| o["metadata"]["name"].as_str().map(str::to_string)) else { return };
        let path = format!("{}/{name}", a.call.uri.split('?').next().unwrap());
        let gone = Call::new(Method::DELETE, path).send(&self.admin).await;
        assert!(gone.admitted() || gone.status == 404, "admin deletes what an attack made: {}", gone.brief());
    }

    /// Checks that `v` is still `before`; records the change and restores it otherwise. Returns
    /// the object to compare the next attack with. A status write a residue admits (`status`)
    /// may change the status, and so the resourceVersion and managed fields, and nothing else.
    async fn unchanged(&self, v: &Victim, before: Value, what: &str, status: bool) -> Value {
        let after = victims::get(&self.admin, v).await;
        if after.as_ref() == Some(&before) {
            return before;
        }
        if let Some(after) = after.as_ref().filter(|a| status && beyond_status(a) == beyond_status(&before)) {
            return after.clone();
        }
        let outcome = match &after {
            None => "DELETED it".to_string(),
            Some(a) if a["metadata"]["deletionTimestamp"].is_string() => "set it DELETING".to_string(),
            Some(a) => format!("CHANGED it: {}", differences(&before, a, "").join(", ")),
        };
        self.fail(&v.label(), what, outcome);
        victims::restore(&self.admin, v).await;
        victims::get(&self.admin, v).await.expect("restored")
    }
}

/// The object without what a status write changes.
fn beyond_status(object: &Value) -> Value {
    let mut object = object.clone();
    object.as_object_mut().map(|o| o.remove("status"));
    if let Some(meta) = object["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    object
}

/// The JSON pointers where `a` and `b` differ (the leaves, at most a few).
fn differences(a: &Value, b: &Value, at: &str) -> Vec<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter()
                .flat_map(|k| {
                    differences(
                        x.get(k).unwrap_or(&Value::Null),
                        y.get(k).unwrap_or(&Value::Null),
                        &format!("{at}/{k}"),
                    )
                })
                .take(6)
                .collect()
        }
        _ if a == b => vec![],
        _ => vec![at.to_string()],
    }
}
