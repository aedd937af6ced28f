//! The README's snippets are real: every Rust block appears, line for line, in one of the
//! crate's examples (which compile and run), and every TOML line in `examples/kit.toml` (which
//! `tests/config.rs` reads and validates).

/// The crate's README and the repository's, whose tour is the same.
const READMES: &[&str] = &[
    include_str!("../README.md"),
    include_str!("../../../README.md"),
];
const EXAMPLES: &[(&str, &str)] = &[
    ("one_layer.rs", include_str!("../examples/one_layer.rs")),
    ("kit.rs", include_str!("../examples/kit.rs")),
    ("config_file.rs", include_str!("../examples/config_file.rs")),
    (
        "balance_channel.rs",
        include_str!("../../health-layer/examples/balance_channel.rs"),
    ),
    (
        "from_balance_list.rs",
        include_str!("../examples/from_balance_list.rs"),
    ),
    ("discover.rs", include_str!("../examples/discover.rs")),
    ("unix_socket.rs", include_str!("../examples/unix_socket.rs")),
];
const KIT_TOML: &str = include_str!("../../../examples/kit.toml");

fn blocks(lang: &str) -> Vec<Vec<&'static str>> {
    let mut out = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in READMES.iter().flat_map(|r| r.lines()) {
        match &mut current {
            None if line.trim() == format!("```{lang}") => current = Some(Vec::new()),
            Some(block) if line.trim() == "```" => {
                out.push(std::mem::take(block));
                current = None;
            }
            Some(block) => block.push(line),
            None => {}
        }
    }
    out
}

fn trimmed(lines: &[&str]) -> Vec<String> {
    lines
        .iter()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn every_rust_snippet_is_in_an_example() {
    let snippets = blocks("rust");
    assert!(snippets.len() >= 8, "each README's tour has four snippets");
    for snippet in snippets {
        let want = trimmed(&snippet);
        let found = EXAMPLES.iter().any(|(_, source)| {
            let have = trimmed(&source.lines().collect::<Vec<_>>());
            have.windows(want.len()).any(|w| w == want.as_slice())
        });
        assert!(
            found,
            "README snippet not found in any example:\n{}",
            want.join("\n")
        );
    }
}

#[test]
fn every_toml_line_is_in_the_example_file() {
    let strip = |l: &str| l.split(" #").next().unwrap_or("").trim().to_owned();
    let file: Vec<String> = KIT_TOML.lines().map(strip).collect();
    for snippet in blocks("toml") {
        for line in snippet.iter().map(|l| strip(l)).filter(|l| !l.is_empty()) {
            assert!(
                file.contains(&line),
                "README TOML line not in examples/kit.toml: {line}"
            );
        }
    }
}
