//! A pass-through in front of LocalStack's EC2 endpoint that keeps each request's parameters (EC2's
//! query protocol: a form-encoded POST), to read what the operator asked where LocalStack does not
//! show it: AssociateAddress's `PrivateIpAddress`, which it accepts and ignores.

use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::common::sqs_faults::forward;

type Forms = Arc<Mutex<Vec<Vec<(String, String)>>>>;

pub struct Asked {
    pub url: String,
    forms: Forms,
}

impl Asked {
    /// Listens on a free loopback port, forwarding to LocalStack (`AWS_ENDPOINT_URL`).
    pub async fn start() -> Asked {
        let endpoint = std::env::var("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL (tests/env.sh env)");
        let upstream = endpoint.trim_start_matches("http://").trim_end_matches('/').to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let forms = Forms::default();
        let kept = forms.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (kept, upstream) = (kept.clone(), upstream.clone());
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let (kept, upstream) = (kept.clone(), upstream.clone());
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
                        let form = form_urlencoded::parse(&body).map(|(k, v)| (k.into_owned(), v.into_owned()));
                        kept.lock().unwrap().push(form.collect());
                        forward(&upstream, parts, body).await
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        Asked { url, forms }
    }

    /// The parameters `names` of every request of action `action`, in order.
    pub fn of(&self, action: &str, names: &[&str]) -> Vec<Vec<Option<String>>> {
        let forms = self.forms.lock().unwrap();
        let of_action = forms.iter().filter(|f| f.iter().any(|(k, v)| k == "Action" && v == action));
        let value = |f: &Vec<(String, String)>, name: &str| f.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        of_action.map(|f| names.iter().map(|n| value(f, n)).collect()).collect()
    }
}
