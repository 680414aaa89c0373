//! A relay between the EC2 adapter and LocalStack that answers as AWS does where LocalStack
//! does not, for the calls these tests make; everything else, including the state the tests
//! check, is LocalStack's:
//! - DeleteSecurityGroup of a group the test holds fails with `DependencyViolation`, as AWS
//!   answers while the group's instance shuts down (LocalStack deletes any group at once);
//! - AssociateAddress's `PrivateIpAddress` is accepted and ignored by LocalStack, which reports
//!   every Elastic IP on the primary private IPv4. The relay remembers the private IPv4 each
//!   association named and DescribeAddresses reports that one, as AWS's does ("the primary or
//!   secondary private IP address to associate with the Elastic IP address"). LocalStack
//!   checks neither that the address is the interface's nor that it is free; AWS refuses an
//!   address already associated unless `AllowReassociation` (which the adapter always sets).

use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

/// Relays requests to LocalStack; DeleteSecurityGroup of a held group fails as on AWS, and
/// DescribeAddresses reports the private IPv4 each association named.
pub struct Relay {
    held: Mutex<HashSet<String>>,
    /// RunInstances never answers: the operator dies while it waits.
    pub stall_launches: std::sync::atomic::AtomicBool,
    pub url: String,
    /// The `PrivateIpAddress` each AssociateAddress named, by allocation id.
    associations: Mutex<BTreeMap<String, String>>,
}

impl Relay {
    pub async fn start(upstream: String) -> Arc<Relay> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = Arc::new(Relay {
            held: Mutex::default(),
            stall_launches: Default::default(),
            url: format!("http://{}", listener.local_addr().unwrap()),
            associations: Mutex::default(),
        });
        let http = reqwest::Client::new();
        let server = relay.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let (relay, upstream, http) = (server.clone(), upstream.clone(), http.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let (relay, upstream, http) = (relay.clone(), upstream.clone(), http.clone());
                        async move { Ok::<_, Infallible>(relay.forward(req, &upstream, &http).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        relay
    }

    async fn forward(
        &self,
        req: hyper::Request<hyper::body::Incoming>,
        upstream: &str,
        http: &reqwest::Client,
    ) -> hyper::Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        let form: Vec<(String, String)> = url_pairs(&body);
        let field = |k: &str| form.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        if field("Action").as_deref() == Some("RunInstances")
            && self.stall_launches.load(std::sync::atomic::Ordering::SeqCst)
        {
            std::future::pending::<()>().await;
        }
        if field("Action").as_deref() == Some("DeleteSecurityGroup")
            && let Some(group) = field("GroupId")
            && self.held.lock().unwrap().contains(&group)
        {
            let xml = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>DependencyViolation</Code>\
                 <Message>resource {group} has a dependent object</Message></Error></Errors>\
                 <RequestID>0b1c2d3e-relay</RequestID></Response>"
            );
            return hyper::Response::builder().status(400).body(Full::new(Bytes::from(xml))).unwrap();
        }
        let url = format!("{upstream}{}", parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"));
        let mut request = http.request(parts.method.clone(), url).body(body.to_vec());
        for (name, value) in &parts.headers {
            if name != "host" && name != "content-length" {
                request = request.header(name, value);
            }
        }
        let response = request.send().await.unwrap();
        let mut out = hyper::Response::builder().status(response.status().as_u16());
        for (name, value) in response.headers() {
            if name != "content-length" && name != "transfer-encoding" {
                out = out.header(name, value);
            }
        }
        let ok = response.status().is_success();
        let mut body = response.bytes().await.unwrap();
        match (field("Action").as_deref(), field("AllocationId")) {
            (Some("AssociateAddress"), Some(allocation)) if ok => {
                let mut named = self.associations.lock().unwrap();
                match field("PrivateIpAddress") {
                    Some(ip) => named.insert(allocation, ip),
                    None => named.remove(&allocation),
                };
            }
            (Some("DescribeAddresses"), _) if ok => {
                let named = self.associations.lock().unwrap();
                body = Bytes::from(as_associated(&String::from_utf8_lossy(&body), &named));
            }
            _ => {}
        }
        out.body(Full::new(body)).unwrap()
    }

    pub fn hold(&self, group: &str) {
        self.held.lock().unwrap().insert(group.to_string());
    }

    pub fn let_go(&self, group: &str) {
        self.held.lock().unwrap().remove(group);
    }
}

/// `a=b&c=d` (form encoding) into pairs.
pub fn url_pairs(body: &[u8]) -> Vec<(String, String)> {
    reqwest::Url::parse(&format!("http://x/?{}", String::from_utf8_lossy(body)))
        .map(|u| u.query_pairs().map(|(k, v)| (k.into_owned(), v.into_owned())).collect())
        .unwrap_or_default()
}

/// `xml`, a DescribeAddresses answer, with the `privateIpAddress` of each address in `named`
/// (by allocation id) replaced by the one named. LocalStack opens each address's item with its
/// `allocationId`, so what follows it up to the next one is that address's.
pub fn as_associated(xml: &str, named: &BTreeMap<String, String>) -> String {
    const OPEN: &str = "<allocationId>";
    let mut parts = xml.split(OPEN);
    let mut out = parts.next().unwrap_or_default().to_string();
    for part in parts {
        out.push_str(OPEN);
        let allocation = part.split('<').next().unwrap_or_default();
        let (Some(ip), Some(start)) = (named.get(allocation), part.find("<privateIpAddress>")) else {
            out.push_str(part);
            continue;
        };
        let start = start + "<privateIpAddress>".len();
        let end = part[start..].find('<').map_or(part.len(), |e| start + e);
        out.push_str(&format!("{}{ip}{}", &part[..start], &part[end..]));
    }
    out
}

#[test]
fn an_address_is_reported_at_the_private_ip_its_association_named() {
    let xml = "<addressesSet><item><allocationId>eipalloc-1</allocationId><privateIpAddress>10.0.0.5</privateIpAddress>\
               <tagSet><item><key>k</key></item></tagSet></item><item><allocationId>eipalloc-2</allocationId>\
               <privateIpAddress>10.0.0.5</privateIpAddress></item><item><allocationId>eipalloc-3</allocationId></item></addressesSet>";
    let named =
        BTreeMap::from([("eipalloc-1".to_string(), "10.0.0.77".to_string()), ("eipalloc-3".into(), "10.0.0.9".into())]);
    let out = as_associated(xml, &named);
    assert!(out.contains("eipalloc-1</allocationId><privateIpAddress>10.0.0.77</privateIpAddress><tagSet>"), "{out}");
    assert!(out.contains("eipalloc-2</allocationId><privateIpAddress>10.0.0.5<"), "{out}");
    assert!(out.contains("eipalloc-3</allocationId></item>"), "not associated: {out}");
    assert_eq!(as_associated(xml, &BTreeMap::new()), xml);
}
