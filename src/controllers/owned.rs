//! Reading a Secret only when it is skyport's, with no right to read Secrets at all.
//!
//! skyport is granted no `get` on Secrets: with it, a stolen token would read every Secret of the
//! cluster by name. Instead it sends a JSON patch made only of `test` operations on the Secret's
//! controller owner reference. The API server tests them against the stored object: when one
//! fails it answers 422 and returns nothing of the object; when all pass the patch is a no-op
//! update, whose answer is the object. The admission policy refuses every update of a Secret that
//! no skyport object controls, so the same `patch` verb cannot read anyone else's Secret either.

use hyper::Request;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// What a guarded read found.
#[derive(Debug)]
pub enum Guarded<K> {
    Missing,
    /// The object exists and the tests failed: it is not ours, and it was not read.
    NotOurs,
    Ours(K),
}

/// `test` operations: the first owner reference has these fields (`controller` is always tested
/// to be true).
pub fn owner_tests(fields: &[(&str, &str)]) -> Vec<Value> {
    let mut ops: Vec<Value> = fields
        .iter()
        .map(|(field, value)| json!({"op": "test", "path": format!("/metadata/ownerReferences/0/{field}"), "value": value}))
        .collect();
    ops.push(json!({"op": "test", "path": "/metadata/ownerReferences/0/controller", "value": true}));
    ops
}

/// Sends the JSON patch `ops` to the object `name` in `namespace`. With `tests` only (see
/// [`owner_tests`]) it reads the object if they hold, and changes nothing.
pub async fn json_patch<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    ops: &[Value],
) -> Result<Guarded<K>, kube::Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let url = format!("{}/{name}", K::url_path(&(), Some(namespace)));
    let body = serde_json::to_vec(ops).map_err(kube::Error::SerdeError)?;
    let request = Request::patch(url)
        .header(hyper::header::CONTENT_TYPE, "application/json-patch+json")
        .body(body)
        .map_err(kube::Error::HttpError)?;
    match client.request::<K>(request).await {
        Ok(obj) => Ok(Guarded::Ours(obj)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Guarded::Missing),
        Err(kube::Error::Api(e)) if e.code == 422 => Ok(Guarded::NotOurs),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_controller_flag_is_always_tested() {
        let ops = owner_tests(&[("uid", "u-1")]);
        assert_eq!(ops[0], json!({"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": "u-1"}));
        assert_eq!(ops[1]["path"], "/metadata/ownerReferences/0/controller");
        assert_eq!(ops[1]["value"], json!(true));
    }
}
