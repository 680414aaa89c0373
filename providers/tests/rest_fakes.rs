//! The DigitalOcean and Hetzner Cloud adapters against small in-test fakes of their APIs.
//!
//! Each fake serves the few endpoints the adapters use with the published paths, status codes,
//! JSON shapes, error bodies and rate-limit headers (see the doc comments at the top of
//! `src/digitalocean/mod.rs` and `src/hetzner/mod.rs` for the pages they follow). A host becomes
//! `active` / `running` with a public IP after a few reads, as a real VM does after booting.
//!
//! One contract suite runs against both adapters; provider-specific tests cover 429 handling,
//! error mapping, token hygiene and pagination.

mod contract;

#[path = "rest_fakes/fake_digitalocean.rs"]
mod fake_digitalocean;
#[path = "rest_fakes/fake_hetzner.rs"]
mod fake_hetzner;
#[path = "rest_fakes/fake_hetzner_floating.rs"]
mod fake_hetzner_floating;
#[path = "rest_fakes/fake_hetzner_placement.rs"]
mod fake_hetzner_placement;
#[path = "rest_fakes/fake_hetzner_rules.rs"]
mod fake_hetzner_rules;
#[path = "rest_fakes/fake_server.rs"]
mod fake_server;

#[path = "rest_fakes/digitalocean.rs"]
mod digitalocean;
#[path = "rest_fakes/hetzner.rs"]
mod hetzner;
#[path = "rest_fakes/hetzner_floating.rs"]
mod hetzner_floating;
#[path = "rest_fakes/push.rs"]
mod push;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use providers::digitalocean::{DigitalOceanProvider, DigitalOceanSettings};
use providers::hetzner::{HetznerProvider, HetznerSettings};
use providers::hosts::HostProvider;
use providers::rest::ApiToken;
use providers::{ErrorClass, HostError};

const TOKEN: &str = "test-token-3f9a0c1d8e7b6a5f4e3d2c1b0a998877";
/// Reads of a host before the fake reports it running.
const POLLS_UNTIL_RUNNING: u32 = 2;

fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn do_provider(base: &str, token: &str, page_size: u32) -> DigitalOceanProvider {
    install_crypto();
    let mut settings = DigitalOceanSettings::new(ApiToken::new(token));
    settings.rest.base_url = base.into();
    settings.rest.timeout = Duration::from_secs(10);
    settings.page_size = page_size;
    DigitalOceanProvider::new(settings).unwrap()
}

fn hz_provider(base: &str, token: &str, page_size: u32) -> HetznerProvider {
    install_crypto();
    let mut settings = HetznerSettings::new(ApiToken::new(token));
    settings.rest.base_url = base.into();
    settings.rest.timeout = Duration::from_secs(10);
    settings.page_size = page_size;
    HetznerProvider::new(settings).unwrap()
}

/// Every error a test provoked: none may show the token.
fn assert_no_token(errors: &[HostError]) {
    for e in errors {
        assert!(!e.to_string().contains(TOKEN), "Display leaks the token: {e}");
        assert!(!format!("{e:?}").contains(TOKEN), "Debug leaks the token: {e:?}");
    }
}

#[tokio::test]
async fn unreachable_endpoints_are_unavailable_not_panics() {
    install_crypto();
    // Bind and drop a listener to get a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let provider = do_provider(&format!("http://127.0.0.1:{port}"), TOKEN, 200);
    let e = provider.get("1").await.unwrap_err();
    assert!(matches!(e, HostError::Unavailable { .. }), "{e:?}");
    assert_eq!(e.class(), ErrorClass::Transient);
    assert_no_token(&[e]);
    // A base URL that is not HTTP is refused up front.
    let mut settings = HetznerSettings::new(ApiToken::new(TOKEN));
    settings.rest.base_url = "ftp://example.invalid".into();
    assert!(matches!(HetznerProvider::new(settings), Err(HostError::Invalid { .. })));
    let settings = HetznerSettings::new(ApiToken::new("  "));
    assert!(matches!(HetznerProvider::new(settings), Err(HostError::Unauthorized { .. })));
}
