use super::*;

const KEY: &str = "wCR3TomqL60P4MLphr9nSLR+tS5cgq7pccADVo2zaaQ=";
const OTHER: &str = "ljQqivQjyn4K6qv2SSldOpHeLToaIIzXNB+C6GYVXvY=";

#[tokio::test]
async fn a_frame_round_trips_and_opens_only_with_its_key_untampered() {
    let key = PushKey::derive(KEY).unwrap();
    let frame = Frame::seal(&key, 7, b"[server]\n").unwrap();
    let bytes = frame.to_bytes();
    let read = Frame::read(&mut bytes.as_slice()).await.unwrap();
    assert_eq!(read, frame);
    assert_eq!(read.open(&key).unwrap(), b"[server]\n");
    assert!(!bytes.windows(9).any(|w| w == b"[server]\n"), "the config is not in the clear");

    assert!(matches!(read.open(&PushKey::derive(OTHER).unwrap()), Err(PushError::Open)));
    // Every header field and every sealed byte is authenticated.
    let mut later = read.clone();
    later.generation = 8;
    assert!(matches!(later.open(&key), Err(PushError::Open)));
    for i in 0..read.sealed.len() {
        let mut flipped = read.clone();
        flipped.sealed[i] ^= 1;
        assert!(matches!(flipped.open(&key), Err(PushError::Open)), "byte {i}");
    }
    let mut nonce = read.clone();
    nonce.nonce[0] ^= 1;
    assert!(matches!(nonce.open(&key), Err(PushError::Open)));
}

#[test]
fn the_push_key_is_derived_not_the_noise_key_and_never_printed() {
    use base64::Engine as _;
    let key = PushKey::derive(KEY).unwrap();
    let raw = base64::engine::general_purpose::STANDARD.decode(KEY).unwrap();
    assert_ne!(key.0.as_slice(), raw.as_slice());
    assert_eq!(key, PushKey::derive(KEY).unwrap());
    assert_ne!(key, PushKey::derive(OTHER).unwrap());
    assert_eq!(format!("{key:?}"), "PushKey(<redacted>)");
    assert!(matches!(PushKey::derive("c2hvcnQ="), Err(PushError::InvalidKey)));
    assert!(matches!(PushKey::derive("not base64!"), Err(PushError::InvalidKey)));
}

/// A push receiver on a free port that greets with generation 3 and answers every frame
/// with `answer(frame)`.
async fn receiver(answer: impl Fn(&Frame) -> Vec<u8> + Send + 'static) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        conn.write_all(&greeting(3)).await.unwrap();
        let frame = Frame::read(&mut conn).await.unwrap();
        conn.write_all(&answer(&frame)).await.unwrap();
    });
    address
}

#[tokio::test]
async fn only_a_host_that_answers_it_cannot_take_the_push_is_replaced() {
    let server = ExitServer { control_port: 2333, noise_private_key: KEY.into(), services: vec![] };
    let unavailable = |got: Result<bool, HostError>| matches!(got, Err(HostError::Unavailable { .. }));
    // Nothing listens, or it closes without a greeting (at its connection limit): a retry
    // may succeed, so an error to retry with backoff, not a new host.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    assert!(unavailable(reconfigure_at("t", free, &server, "").await));
    let closes = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = closes.local_addr().unwrap();
    tokio::spawn(async move { drop(closes.accept().await.unwrap()) });
    assert!(unavailable(reconfigure_at("t", address, &server, "").await));
    // Something else greets there, or an exit server of another push version: replace.
    for hello in [b"SSH-2.0-OpenSSH_9.2p1 Debian\r\n".to_vec(), [&GREETING[..], &[1], &[0; 8]].concat()] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            conn.write_all(&hello).await.unwrap();
        });
        assert!(!reconfigure_at("t", address, &server, "").await.unwrap());
    }
}

#[tokio::test]
async fn answers_count_only_with_proof_of_this_push() {
    let server = ExitServer { control_port: 2333, noise_private_key: KEY.into(), services: vec![] };
    let ours = PushKey::derive(KEY).unwrap();
    let theirs = PushKey::derive(OTHER).unwrap();
    // Proven by our key: applied, or the config refused (an error, not a new host).
    let key = ours.clone();
    let address = receiver(move |f| {
        assert!(f.generation > 3 && f.generation >= now_generation() - 60_000, "above the server's, and now");
        seal_answer(&key, f, Answer::Applied).to_vec()
    })
    .await;
    assert!(reconfigure_at("t", address, &server, "[server]").await.unwrap());
    let key = ours.clone();
    let address = receiver(move |f| seal_answer(&key, f, Answer::Refused).to_vec()).await;
    assert!(matches!(reconfigure_at("t", address, &server, "").await, Err(HostError::Invalid { .. })));
    // A server holding another key cannot prove its refusal with ours: it is the Tunnel's
    // old host, replace it.
    let address = receiver(move |f| seal_answer(&theirs, f, Answer::Unauthenticated).to_vec()).await;
    assert!(!reconfigure_at("t", address, &server, "").await.unwrap());
    // "Applied" without proof (forged on the way, or an answer of another push), or the
    // one-byte answer of the first protocol version: never taken as applied.
    let key = ours.clone();
    let other_push = Frame::seal(&ours, 99, b"x").unwrap();
    for forged in [
        Box::new(|_: &Frame| vec![Answer::Applied as u8; ANSWER_LEN]) as Box<dyn Fn(&Frame) -> Vec<u8> + Send>,
        Box::new(move |_: &Frame| seal_answer(&key, &other_push, Answer::Applied).to_vec()),
        Box::new(|_: &Frame| vec![Answer::Applied as u8]),
    ] {
        let address = receiver(forged).await;
        let got = reconfigure_at("t", address, &server, "").await;
        assert!(matches!(got, Err(HostError::Unavailable { .. })), "{got:?}");
    }
}

#[tokio::test]
async fn oversized_or_foreign_frames_are_refused_before_allocating() {
    let key = PushKey::derive(KEY).unwrap();
    let mut bytes = Frame::seal(&key, 1, b"x").unwrap().to_bytes();
    bytes[0] = 9;
    assert!(matches!(Frame::read(&mut bytes.as_slice()).await, Err(PushError::Malformed("unknown version"))));
    let mut huge = Frame::seal(&key, 1, b"x").unwrap().to_bytes();
    huge[33..37].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(Frame::read(&mut huge.as_slice()).await, Err(PushError::Malformed("length out of bounds"))));
    let short = Frame::seal(&key, 1, b"x").unwrap().to_bytes();
    assert!(matches!(Frame::read(&mut &short[..20]).await, Err(PushError::Malformed("truncated frame"))));
    assert!(Frame::seal(&key, 1, &vec![0u8; MAX_CONFIG + 1]).is_err());
}
