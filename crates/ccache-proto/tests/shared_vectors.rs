//! The shared IPC vectors (`vectors/ipc.txt`, format in `vectors/README.md`)
//! against this crate's codec; mod_ccache's C codec runs the same file
//! (`tools/ccache/apache/test/vectors.c`, `scripts/test-cache-vectors.sh`).

use ccache_proto::ipc::{ErrorCode, IpcError, Kind, Repr, MSG_LEN};
use std::collections::HashSet;

struct Vector {
    line: usize,
    name: String,
    verdict: Vec<String>,
    bytes: Vec<u8>,
}

fn vectors() -> Vec<Vector> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/vectors/ipc.txt");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let l = l.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let (verdict, hex) = l
            .split_once('|')
            .unwrap_or_else(|| panic!("ipc.txt:{}: no '|'", i + 1));
        let hex: String = hex.chars().filter(|c| !c.is_whitespace()).collect();
        assert!(hex.len().is_multiple_of(2), "ipc.txt:{}: odd hex", i + 1);
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|j| u8::from_str_radix(&hex[j..j + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .unwrap_or_else(|e| panic!("ipc.txt:{}: {e}", i + 1));
        let mut words = verdict.split_whitespace().map(str::to_owned);
        let name = words.next().expect("a name");
        out.push(Vector {
            line: i + 1,
            name,
            verdict: words.collect(),
            bytes,
        });
    }
    out
}

fn number(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    }
    .unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn kind_named(n: &str) -> Kind {
    *Kind::ALL
        .iter()
        .find(|k| k.name() == n)
        .unwrap_or_else(|| panic!("no kind named {n}"))
}

fn code_named(n: &str) -> ErrorCode {
    match ErrorCode::ALL.iter().find(|c| c.name() == n) {
        Some(c) => *c,
        None => ErrorCode::from(number(n)),
    }
}

/// The value of `key=value` in a verdict.
fn field<'a>(v: &'a Vector, key: &str) -> Option<&'a str> {
    v.verdict
        .iter()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

#[test]
fn shared_vectors() {
    let vs = vectors();
    assert!(vs.len() >= 30, "only {} vectors", vs.len());
    let mut names = HashSet::new();
    let (mut kinds, mut codes) = (HashSet::new(), HashSet::new());
    for v in &vs {
        let at = format!("ipc.txt:{} ({})", v.line, v.name);
        assert!(names.insert(v.name.clone()), "{at}: name used twice");
        let got = Repr::from_bytes(&v.bytes);
        match v.verdict[0].as_str() {
            "ok" => {
                let kind = kind_named(&v.verdict[1]);
                let doc = u32::try_from(number(field(v, "doc").expect("doc="))).unwrap();
                let value = match (field(v, "value"), field(v, "code")) {
                    (Some(n), None) => number(n),
                    (None, Some(c)) => {
                        assert_eq!(kind, Kind::Error, "{at}: code= is for ERROR");
                        let c = u64::from(code_named(c));
                        codes.insert(c);
                        c
                    }
                    _ => panic!("{at}: one of value= and code="),
                };
                kinds.insert(kind);
                let want = Repr::with_value(kind, doc, value);
                assert_eq!(got, Ok(want), "{at}: decode");
                assert_eq!(&want.to_bytes()[..], &v.bytes[..MSG_LEN], "{at}: encode");
            }
            "err" => {
                let why = v.verdict[1].as_str();
                let ok = match (why, got) {
                    ("truncated", Err(IpcError::Truncated { len })) => len == v.bytes.len(),
                    ("magic", Err(IpcError::BadMagic(_))) => true,
                    ("version", Err(IpcError::BadVersion(_))) => true,
                    ("kind", Err(IpcError::UnknownKind(_))) => true,
                    _ => false,
                };
                assert!(ok, "{at}: want err {why}, got {got:?}");
            }
            other => panic!("{at}: verdict {other}"),
        }
    }
    // Every kind and every error code has a vector, so a kind or a code
    // added on one side is in the file the other side runs.
    for k in Kind::ALL {
        assert!(kinds.contains(&k), "no ok vector for kind {}", k.name());
    }
    for c in ErrorCode::ALL {
        assert!(
            codes.contains(&u64::from(c)),
            "no ERROR vector for code {}",
            c.name()
        );
    }
}
