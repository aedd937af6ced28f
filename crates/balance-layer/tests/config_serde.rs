//! The configuration read from a file (the `serde` feature): the names users write, humantime
//! durations, unknown fields refused, values still checked by `validate`.

use std::time::Duration;

use balance_layer::{BalanceConfig, PeakEwma, Strategy, Weights};

fn read(document: &str) -> Result<BalanceConfig, toml::de::Error> {
    toml::from_str(document)
}

#[test]
fn a_toml_document_sets_every_field() {
    let config = read(
        r#"
        strategy = "weighted"
        wait_for_ready = true
        max_wait = "2s"
        connecting_wait = "750ms"
        seed = 7

        [weights]
        "http://10.0.0.7:50051" = 2.0
        "http://10.0.0.8:50051" = 1
        "#,
    )
    .unwrap();
    let Strategy::Weighted(weights) = &config.strategy else {
        panic!("{:?}", config.strategy)
    };
    assert_eq!(
        weights.iter().collect::<Vec<_>>(),
        [
            ("http://10.0.0.7:50051", 2.0),
            ("http://10.0.0.8:50051", 1.0)
        ]
    );
    assert!(config.wait_for_ready);
    assert_eq!(config.max_wait, Some(Duration::from_secs(2)));
    assert_eq!(config.connecting_wait, Duration::from_millis(750));
    assert_eq!(config.seed, Some(7));
    config.validate().unwrap();
}

#[test]
fn unset_fields_keep_the_defaults() {
    let config = read("").unwrap();
    let defaults = BalanceConfig::default();
    assert!(matches!(config.strategy, Strategy::RoundRobin));
    assert_eq!(config.wait_for_ready, defaults.wait_for_ready);
    assert_eq!(config.max_wait, defaults.max_wait);
    assert_eq!(config.connecting_wait, defaults.connecting_wait);
    assert_eq!(config.seed, defaults.seed);

    let config = read("strategy = \"peak_ewma\"\n[peak_ewma]\ndecay = \"5s\"").unwrap();
    let Strategy::PeakEwma(p) = config.strategy else {
        panic!("{:?}", config.strategy)
    };
    assert_eq!(p, PeakEwma::new().decay(Duration::from_secs(5)));
    for (name, strategy) in [
        ("random", Strategy::Random),
        ("least_in_flight", Strategy::LeastInFlight),
        ("peak_ewma", Strategy::PeakEwma(PeakEwma::new())),
        ("weighted", Strategy::Weighted(Weights::new())),
    ] {
        let config = read(&format!("strategy = \"{name}\"")).unwrap();
        assert_eq!(config.strategy.name(), strategy.name());
    }
}

#[test]
fn unknown_fields_are_refused() {
    let err = read("strategy = \"random\"\ntimout = \"2s\"").unwrap_err();
    assert!(err.to_string().contains("unknown field `timout`"), "{err}");

    let err = read("strategy = \"peak_ewma\"\n[peak_ewma]\ndecai = \"5s\"").unwrap_err();
    assert!(err.to_string().contains("unknown field `decai`"), "{err}");

    let err = read("strategy = \"fastest\"").unwrap_err();
    assert!(
        err.to_string().contains("unknown variant `fastest`"),
        "{err}"
    );
}

#[test]
fn parameters_of_another_strategy_are_refused() {
    let err = read("strategy = \"random\"\n[weights]\nb0 = 2.0").unwrap_err();
    assert!(err.to_string().contains("strategy = \"weighted\""), "{err}");
    let err = read("[peak_ewma]\ndecay = \"5s\"").unwrap_err();
    assert!(
        err.to_string().contains("strategy = \"peak_ewma\""),
        "{err}"
    );
}

#[test]
fn values_are_checked_by_validate_not_by_reading() {
    let config = read("strategy = \"weighted\"\n[weights]\nb0 = 1.0\nb2 = -1.0").unwrap();
    let err = config.validate().unwrap_err();
    assert_eq!((err.field(), err.value()), ("weights[b2]", "-1"));
    assert_eq!(err.config(), "balancer");

    let config = read("strategy = \"peak_ewma\"\n[peak_ewma]\ndefault_rtt = \"0s\"").unwrap();
    assert_eq!(
        config.validate().unwrap_err().field(),
        "peak_ewma.default_rtt"
    );
}

#[test]
fn a_strategy_alone_reads_its_name_or_a_table() {
    #[derive(serde::Deserialize)]
    struct Doc {
        strategy: Strategy,
    }
    let read = |doc: &str| toml::from_str::<Doc>(doc).map(|d| d.strategy);
    assert!(matches!(
        read("strategy = \"least_in_flight\"").unwrap(),
        Strategy::LeastInFlight
    ));
    let Strategy::Weighted(w) = read("strategy = { weighted = { b0 = 3.0 } }").unwrap() else {
        panic!()
    };
    assert_eq!(w.get("b0"), Some(3.0));
    let Strategy::PeakEwma(p) = read("strategy = { peak_ewma = { decay = \"1m\" } }").unwrap()
    else {
        panic!()
    };
    assert_eq!(p.decay, Duration::from_secs(60));
    assert!(read("strategy = { random = {} }").is_ok());
    assert!(read("strategy = { random = { x = 1 } }").is_err());
    assert!(read("strategy = { random = {}, weighted = {} }").is_err());
}

#[test]
fn pick_first_and_ring_hash_read_their_tables() {
    let config =
        read("strategy = \"pick_first\"\n[pick_first]\nshuffle_address_list = true").unwrap();
    assert!(matches!(
        config.strategy,
        Strategy::PickFirst {
            shuffle_address_list: true
        }
    ));
    let config = read("strategy = \"pick_first\"").unwrap();
    assert!(matches!(
        config.strategy,
        Strategy::PickFirst {
            shuffle_address_list: false
        }
    ));

    let config = read(
        r#"
        strategy = "ring_hash"
        seed = 3

        [ring_hash]
        min_ring_size = 512
        max_ring_size = 2048
        request_hash_header = "x-user-id"
        "#,
    )
    .unwrap();
    let Strategy::RingHash {
        min_ring_size,
        max_ring_size,
        request_hash_header,
    } = &config.strategy
    else {
        panic!("{:?}", config.strategy)
    };
    assert_eq!((*min_ring_size, *max_ring_size), (512, 2048));
    assert_eq!(request_hash_header.as_deref(), Some("x-user-id"));
    config.validate().unwrap();

    // Defaults: gRFC A42's sizes, no header.
    let config = read("strategy = \"ring_hash\"").unwrap();
    let Strategy::RingHash {
        min_ring_size,
        max_ring_size,
        request_hash_header,
    } = config.strategy
    else {
        panic!()
    };
    assert_eq!((min_ring_size, max_ring_size), (1024, 8_388_608));
    assert_eq!(request_hash_header, None);
    let config = read("strategy = \"ring_hash\"\n[ring_hash]\nmax_ring_size = 4096").unwrap();
    assert!(matches!(
        config.strategy,
        Strategy::RingHash {
            min_ring_size: 1024,
            max_ring_size: 4096,
            ..
        }
    ));
}

#[test]
fn pick_first_and_ring_hash_refuse_what_is_not_theirs() {
    let err = read("strategy = \"random\"\n[ring_hash]\nmin_ring_size = 1").unwrap_err();
    assert!(
        err.to_string().contains("strategy = \"ring_hash\""),
        "{err}"
    );
    let err = read("[pick_first]\nshuffle_address_list = true").unwrap_err();
    assert!(
        err.to_string().contains("strategy = \"pick_first\""),
        "{err}"
    );
    let err = read("strategy = \"ring_hash\"\n[ring_hash]\nring_size = 1").unwrap_err();
    assert!(
        err.to_string().contains("unknown field `ring_size`"),
        "{err}"
    );
    let err = read("strategy = \"pick_first\"\n[pick_first]\nshuffle = true").unwrap_err();
    assert!(err.to_string().contains("unknown field `shuffle`"), "{err}");

    // Values are checked by `validate`, naming the field as the file writes it.
    let config =
        read("strategy = \"ring_hash\"\n[ring_hash]\nmin_ring_size = 4096\nmax_ring_size = 1024")
            .unwrap();
    let err = config.validate().unwrap_err();
    assert_eq!(
        (err.field(), err.value()),
        ("ring_hash.min_ring_size", "4096")
    );
    let config =
        read("strategy = \"ring_hash\"\n[ring_hash]\nrequest_hash_header = \"x-id-bin\"").unwrap();
    assert_eq!(
        config.validate().unwrap_err().field(),
        "ring_hash.request_hash_header"
    );
}

#[test]
fn pick_first_and_ring_hash_alone_read_their_name_or_a_table() {
    #[derive(serde::Deserialize)]
    struct Doc {
        strategy: Strategy,
    }
    let read = |doc: &str| toml::from_str::<Doc>(doc).map(|d| d.strategy);
    assert!(matches!(
        read("strategy = \"pick_first\"").unwrap(),
        Strategy::PickFirst {
            shuffle_address_list: false
        }
    ));
    assert!(matches!(
        read("strategy = { pick_first = { shuffle_address_list = true } }").unwrap(),
        Strategy::PickFirst {
            shuffle_address_list: true
        }
    ));
    let Strategy::RingHash {
        request_hash_header,
        min_ring_size,
        ..
    } = read("strategy = { ring_hash = { request_hash_header = \"x-user-id\" } }").unwrap()
    else {
        panic!()
    };
    assert_eq!(request_hash_header.as_deref(), Some("x-user-id"));
    assert_eq!(min_ring_size, 1024);
    assert!(read("strategy = \"ring_hash\"").is_ok());
    assert!(read("strategy = { ring_hash = { x = 1 } }").is_err());
}
