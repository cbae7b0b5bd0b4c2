//! `config::LimiterConfig` read from TOML and from JSON (the same input as
//! both).
//!
//! Checked: no panic; a configuration that is read builds its layer, prints
//! back (JSON, and TOML when the TOML printer can write it) to the same
//! configuration, and its layer answers requests without a 500 or a 503: a
//! configuration accepted when read never fails on every request.
#![no_main]

use std::convert::Infallible;
use std::net::SocketAddr;

use http::{Request, Response, StatusCode};
use libfuzzer_sys::fuzz_target;
use tower::{Layer, ServiceExt, service_fn};
use tower_pinned_window::config::{LimiterConfig, Tier};

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = toml::from_str::<LimiterConfig>(text) {
        check(&config);
    }
    if let Ok(config) = serde_json::from_str::<LimiterConfig>(text) {
        check(&config);
    }
});

fn check(config: &LimiterConfig) {
    let json = serde_json::to_string(config).expect("a configuration prints as JSON");
    let back: LimiterConfig = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{json}: {e}"));
    assert_eq!(&back, config, "{json}");
    if let Ok(text) = toml::to_string(config) {
        let back: LimiterConfig = toml::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(&back, config, "{text}");
    }

    let layer = config.layer();
    RUNTIME.with(|runtime| {
        runtime.block_on(async {
            let app = layer.layer(service_fn(|_: Request<()>| async {
                Ok::<_, Infallible>(Response::new(()))
            }));
            let peers: [SocketAddr; 3] = [
                ([203, 0, 113, 7], 443).into(),
                ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1], 443).into(),
                ([10, 0, 0, 1], 443).into(),
            ];
            for (i, peer) in peers.into_iter().enumerate() {
                let mut request = Request::get("/login")
                    .header("x-api-key", "k1")
                    .header("x-forwarded-for", "198.51.100.7")
                    .body(())
                    .expect("a request");
                request.extensions_mut().insert(peer);
                if i == 1 {
                    request.extensions_mut().insert(Tier::new("pro"));
                }
                let status = app
                    .clone()
                    .oneshot(request)
                    .await
                    .expect("infallible")
                    .status();
                assert!(
                    matches!(
                        status,
                        StatusCode::OK | StatusCode::BAD_REQUEST | StatusCode::TOO_MANY_REQUESTS
                    ),
                    "{json}: answered {status}"
                );
            }
        })
    });
}
