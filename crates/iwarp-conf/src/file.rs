//! Configuration files: TOML into a serde type, with environment
//! overrides (feature `toml`).
//!
//! Precedence, highest first: **flags > environment > file > defaults**.
//! [`load`] does the middle two: it reads the file, then lets each
//! `PREFIX_KEY=value` variable replace the file's top-level `key` (the
//! part after `PREFIX_`, in lower case: `CCAPPD_PUSH_POLICY` sets
//! `push_policy`). Defaults are the type's (`#[serde(default)]`), and each
//! tool applies its own flags over what `load` returns (ccache turns the
//! settings into flags placed before the command line's, where a later
//! flag wins; rftp takes a flag when it is given and the file's value
//! otherwise).
//!
//! An environment value is read as a TOML value when it is one (`8`,
//! `true`, `"text"`, `["a", "b"]`) and as text otherwise (`hybrid`,
//! `0.0.0.0:7471`); to pass text that looks like a number, quote it
//! (`PREFIX_NAME='"1024"'`). Only top-level keys can be set this way.
//!
//! Unknown keys are refused when the type says so
//! (`#[serde(deny_unknown_fields)]`, which every tool's type carries): a
//! misspelt key, in the file or in a `PREFIX_` variable, is an error and
//! not a silently ignored setting. Every error names where (`FILE:LINE`,
//! or the variable), the key, what is wrong and the fix.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::ops::Range;
use std::path::Path;

use serde::de::DeserializeOwned;
use toml::de::{DeTable, Deserializer, Error};
use toml::Spanned;

/// Reads the TOML file at `path` (none: only the environment) into `T`,
/// each `{env_prefix}_KEY` variable of the process overriding the file's
/// `key` (an empty `env_prefix`: no overrides). See the module
/// documentation for the precedence and the error format.
pub fn load<T: DeserializeOwned>(path: Option<&Path>, env_prefix: &str) -> Result<T, String> {
    load_from(path, env_prefix, std::env::vars_os())
}

/// [`load`] with the environment given (tests, or a tool that filters it).
pub fn load_from<T: DeserializeOwned>(
    path: Option<&Path>,
    env_prefix: &str,
    env: impl IntoIterator<Item = (OsString, OsString)>,
) -> Result<T, String> {
    let (text, file) = match path {
        Some(p) => (
            std::fs::read_to_string(p).map_err(|e| {
                format!(
                    "{}: cannot read the configuration file: {e} (fix: give the path of a \
                     readable file)",
                    p.display()
                )
            })?,
            p.display().to_string(),
        ),
        None => (String::new(), "(no configuration file)".to_owned()),
    };
    let vars = overrides(env_prefix, env)?;
    from_text(&text, &file, env_prefix, &vars)
}

/// [`load_lenient_from`] with the process's environment.
pub fn load_lenient<T: DeserializeOwned + Default>(
    path: Option<&Path>,
    env_prefix: &str,
) -> (T, Vec<String>) {
    load_lenient_from(path, env_prefix, std::env::vars_os())
}

/// [`load_from`] for a program that must go on whatever its settings say
/// (the LD_PRELOAD shim runs inside someone else's program): each bad
/// setting is left out and its error returned, and the rest apply.
///
/// Left out, each with the error [`load_from`] would give for it (where,
/// the key, what is wrong, the fix): a file that cannot be read (the
/// variables still apply); a line of the file that is not TOML, or whose
/// key is unknown or value wrong (the file's other lines still apply; a
/// value that spans lines goes line by line until what is left parses); a
/// variable with a bad name, a value that is not UTF-8, an unknown key or
/// a wrong value. `T` must take any subset of its keys
/// (`#[serde(default)]`); should even that fail, `T::default()` is
/// returned with the errors. An empty list: everything applied.
pub fn load_lenient_from<T: DeserializeOwned + Default>(
    path: Option<&Path>,
    env_prefix: &str,
    env: impl IntoIterator<Item = (OsString, OsString)>,
) -> (T, Vec<String>) {
    let mut errors = Vec::new();
    let (mut text, file) = match path {
        Some(p) => match std::fs::read_to_string(p) {
            Ok(t) => (t, p.display().to_string()),
            Err(e) => {
                errors.push(format!(
                    "{}: cannot read the configuration file: {e} (fix: give the path of a \
                     readable file)",
                    p.display()
                ));
                (String::new(), p.display().to_string())
            }
        },
        None => (String::new(), "(no configuration file)".to_owned()),
    };
    let mut vars = Vec::new();
    for (k, v) in env {
        match overrides(env_prefix, [(k, v)]) {
            Ok(one) => vars.extend(one),
            Err(e) => errors.push(e),
        }
    }
    vars.sort_by(|a, b| a.name.cmp(&b.name));
    // Each round leaves out the setting the error names, so at most one
    // round per line and variable. A file that is not TOML at
    // NOT_TOML_LINES lines is not a TOML file with a slip: it is left out
    // whole, with one more line saying so, rather than a line per line.
    const NOT_TOML_LINES: usize = 3;
    let mut not_toml = 0;
    loop {
        let e = match from_text::<T>(&text, &file, env_prefix, &vars) {
            Ok(t) => return (t, errors),
            Err(e) => e,
        };
        let var = e
            .strip_prefix("environment ")
            .and_then(|r| r.split([':', '=']).next())
            .and_then(|name| vars.iter().position(|v| v.name == name));
        let line = e
            .strip_prefix(file.as_str())
            .and_then(|r| r.strip_prefix(':'))
            .and_then(|r| r.split(':').next())
            .and_then(|n| n.parse::<usize>().ok());
        let syntax = line.is_some() && e.contains(": not TOML: ");
        errors.push(e);
        if let Some(i) = var {
            vars.remove(i);
            continue;
        }
        if syntax {
            not_toml += 1;
            if not_toml == NOT_TOML_LINES {
                errors.push(format!(
                    "{file}: {NOT_TOML_LINES} lines are not TOML: the whole file is ignored \
                     (fix: write it as TOML, one `key = value` a line, text values quoted)"
                ));
                text.clear();
                continue;
            }
        }
        if line.is_some_and(|n| blank_line(&mut text, n)) {
            continue;
        }
        return (T::default(), errors);
    }
}

/// Blanks line `n` (1-based) of `text`, keeping its length and the line
/// numbers after it; false if there is no such line or it is blank.
fn blank_line(text: &mut String, n: usize) -> bool {
    let start = match n {
        0 => return false,
        1 => 0,
        _ => match text.match_indices('\n').nth(n - 2) {
            Some((i, _)) => i + 1,
            None => return false,
        },
    };
    let end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    if text[start..end].trim().is_empty() {
        return false;
    }
    let blank = " ".repeat(text[start..end].len());
    text.replace_range(start..end, &blank);
    true
}

/// The file's `text` (named `file` in errors) with the variables `vars`
/// over it, into `T`.
fn from_text<T: DeserializeOwned>(
    text: &str,
    file: &str,
    env_prefix: &str,
    vars: &[Var],
) -> Result<T, String> {
    // The variables as TOML lines after the file's text blanked out (same
    // bytes, new lines kept): one span measure then tells a file error
    // (its line) from a variable's (its range).
    let mut env_src: String = text
        .bytes()
        .map(|b| if b == b'\n' { '\n' } else { ' ' })
        .collect();
    env_src.push('\n');
    let mut ranges = Vec::with_capacity(vars.len());
    for v in vars {
        let start = env_src.len();
        let _ = writeln!(env_src, "{} = {}", v.key, v.toml);
        ranges.push(start..env_src.len());
    }

    let doc = DeTable::parse(text).map_err(|e| {
        format!(
            "{}: not TOML: {} (fix: quote text values (name = \"text\"), keep numbers and \
             true/false bare, write lists as [\"a\", \"b\"])",
            at_line(file, text, e.span()),
            e.message().trim()
        )
    })?;
    let span = doc.span();
    let mut table = doc.into_inner();
    if !vars.is_empty() {
        let env_doc = DeTable::parse(&env_src).map_err(|e| {
            let who = e
                .span()
                .and_then(|s| ranges.iter().position(|r| r.contains(&s.start)))
                .map_or(env_prefix, |i| vars[i].name.as_str());
            format!(
                "environment {who}: {} (fix: correct or unset it)",
                e.message().trim()
            )
        })?;
        for (k, v) in env_doc.into_inner() {
            table.remove(k.get_ref().as_ref());
            table.insert(k, v);
        }
    }
    T::deserialize(Deserializer::from(Spanned::new(span, table)))
        .map_err(|e| explain(&e, file, text, vars, &ranges))
}

/// A `PREFIX_KEY=value` variable, as a TOML line.
struct Var {
    name: String,
    key: String,
    value: String,
    toml: String,
}

/// The environment's `{prefix}_KEY` variables, sorted by name.
fn overrides(
    prefix: &str,
    env: impl IntoIterator<Item = (OsString, OsString)>,
) -> Result<Vec<Var>, String> {
    if prefix.is_empty() {
        return Ok(Vec::new());
    }
    let head = format!("{prefix}_");
    let mut vars = Vec::new();
    for (name, value) in env {
        let Some(name) = name.to_str() else { continue };
        let Some(key) = name.strip_prefix(&head).filter(|k| !k.is_empty()) else {
            continue;
        };
        // A bare TOML key (toml.io, Keys: A-Za-z0-9_-).
        if !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!(
                "environment {name}: not a setting name (fix: {head} followed by letters, digits \
                 and _, as in {head}SOME_KEY; or unset it)"
            ));
        }
        let value = value.into_string().map_err(|_| {
            format!("environment {name}: the value is not UTF-8 (fix: give it in UTF-8)")
        })?;
        let toml = if !value.contains(['\n', '\r'])
            && format!("v = {value}").parse::<toml::Table>().is_ok()
        {
            value.clone()
        } else {
            toml::Value::String(value.clone()).to_string()
        };
        vars.push(Var {
            name: name.to_owned(),
            key: key.to_ascii_lowercase(),
            value,
            toml,
        });
    }
    vars.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(vars)
}

/// A deserialization error with where it comes from and the fix.
fn explain(e: &Error, file: &str, text: &str, vars: &[Var], ranges: &[Range<usize>]) -> String {
    let msg = e.message().trim();
    // A field's own check (`de`, a tool's `deserialize_with`) may end its
    // message with its fix, in the same form: keep that one.
    let (msg, own_fix) = match msg.strip_suffix(')').and_then(|m| m.rsplit_once(" (fix: ")) {
        Some((m, f)) => (m, Some(f)),
        None => (msg, None),
    };
    let fix = if let Some(f) = own_fix {
        f
    } else if msg.starts_with("unknown field") {
        "remove the key or correct its spelling"
    } else if msg.starts_with("missing field") {
        "add the key"
    } else {
        "give a value of the expected type"
    };
    let span = e.span();
    if let Some(i) = span
        .as_ref()
        .and_then(|s| ranges.iter().position(|r| r.contains(&s.start)))
    {
        let v = &vars[i];
        return format!(
            "environment {}={:?}: key `{}`: {msg} (fix: {fix}, or unset {})",
            v.name, v.value, v.key, v.name
        );
    }
    if msg.starts_with("missing field") {
        // Its span is the whole table: no line to name.
        let prefix_hint = vars
            .first()
            .map(|_| " or its environment variable")
            .unwrap_or("");
        return format!("{file}: {msg} (fix: {fix} to the file{prefix_hint})");
    }
    let key = span
        .as_ref()
        .and_then(|s| key_on_line(text, s.start))
        .map(|k| format!(" key `{k}`:"))
        .unwrap_or_default();
    format!("{}:{key} {msg} (fix: {fix})", at_line(file, text, span))
}

/// `FILE:LINE` of a byte offset (just `FILE` without one).
fn at_line(file: &str, text: &str, span: Option<Range<usize>>) -> String {
    match span {
        Some(s) if s.start <= text.len() => {
            let line = text.as_bytes()[..s.start]
                .iter()
                .filter(|&&b| b == b'\n')
                .count()
                + 1;
            format!("{file}:{line}")
        }
        _ => file.to_owned(),
    }
}

/// The key of the `key = value` line holding byte `at`, if it is one.
fn key_on_line(text: &str, at: usize) -> Option<String> {
    let start = text.get(..at)?.rfind('\n').map_or(0, |i| i + 1);
    let line = text[start..].lines().next()?;
    let (k, _) = line.split_once('=')?;
    let k = k.trim().trim_matches(['"', '\'']);
    (!k.is_empty() && !k.starts_with('[')).then(|| k.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::path::PathBuf;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct User {
        name: String,
        #[serde(default)]
        write: bool,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Conf {
        listen: String,
        docs: u32,
        ratio: f64,
        crc: bool,
        policy: Option<String>,
        allow: Vec<String>,
        users: Vec<User>,
    }

    impl Default for Conf {
        fn default() -> Conf {
            Conf {
                listen: "127.0.0.1:2121".into(),
                docs: 64,
                ratio: 0.0,
                crc: false,
                policy: None,
                allow: Vec::new(),
                users: Vec::new(),
            }
        }
    }

    struct File(PathBuf);
    impl Drop for File {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    fn file(name: &str, text: &str) -> File {
        let f = std::env::temp_dir().join(format!("iwarp-conf-{}-{name}", std::process::id()));
        std::fs::write(&f, text).unwrap();
        File(f)
    }
    fn env(v: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        v.iter().map(|(k, v)| (k.into(), v.into())).collect()
    }
    fn conf(f: &File, e: &[(&str, &str)]) -> Result<Conf, String> {
        load_from(Some(&f.0), "TOOL", env(e))
    }

    const GOOD: &str = "# a tool\nlisten = \"0.0.0.0:7471\"\ndocs = 1024\nratio = 0.5\n\
                        allow = [\"a\", \"b\"]\n\n[[users]]\nname = \"ann\"\nwrite = true\n";

    #[test]
    fn a_good_file_over_the_defaults() {
        let f = file("good.toml", GOOD);
        let c = conf(&f, &[("PATH", "/bin"), ("TOOLDOCS", "1"), ("TOOL_", "1")]).unwrap();
        assert_eq!(
            c,
            Conf {
                listen: "0.0.0.0:7471".into(),
                docs: 1024,
                ratio: 0.5,
                allow: vec!["a".into(), "b".into()],
                users: vec![User {
                    name: "ann".into(),
                    write: true
                }],
                ..Conf::default()
            }
        );
        // No file, no variables: the defaults.
        assert_eq!(
            load_from::<Conf>(None, "TOOL", env(&[])),
            Ok(Conf::default())
        );
    }

    #[test]
    fn the_environment_overrides_the_file() {
        let f = file("env.toml", GOOD);
        let c = conf(
            &f,
            &[
                ("TOOL_DOCS", "7"),
                ("TOOL_POLICY", "hybrid"),      // bare text
                ("TOOL_LISTEN", "\"[::1]:9\""), // quoted text
                ("TOOL_ALLOW", "[\"c\"]"),      // a list
                ("TOOL_CRC", "true"),           // a switch
                ("OTHER_DOCS", "9"),            // another prefix
            ],
        )
        .unwrap();
        assert_eq!(
            (c.docs, c.policy.as_deref(), c.listen.as_str(), c.crc),
            (7, Some("hybrid"), "[::1]:9", true)
        );
        assert_eq!(c.allow, ["c"]);
        assert_eq!(c.ratio, 0.5, "what the variables leave is the file's");
        // Without a file, over the defaults; the empty prefix reads none.
        let c: Conf = load_from(None, "TOOL", env(&[("TOOL_DOCS", "3")])).unwrap();
        assert_eq!((c.docs, c.ratio), (3, 0.0));
        let c: Conf = load_from(None, "", env(&[("_DOCS", "3")])).unwrap();
        assert_eq!(c.docs, 64);
    }

    #[test]
    fn file_errors_name_the_line_the_key_and_the_fix() {
        let f = file("unknown.toml", "docs = 3\n\ndox = 4\n");
        let e = conf(&f, &[]).unwrap_err();
        assert!(
            e.starts_with(&format!("{}:3: key `dox`:", f.0.display())),
            "{e}"
        );
        assert!(
            e.contains("unknown field `dox`") && e.contains("correct its spelling"),
            "{e}"
        );

        let f = file("type.toml", "# x\ndocs = \"many\"\n");
        let e = conf(&f, &[]).unwrap_err();
        assert!(
            e.starts_with(&format!("{}:2: key `docs`:", f.0.display())),
            "{e}"
        );
        assert!(e.contains("expected type"), "{e}");

        let f = file("nested.toml", "[[users]]\nname = \"a\"\nwritable = true\n");
        let e = conf(&f, &[]).unwrap_err();
        assert!(e.contains(":3: key `writable`: unknown field"), "{e}");

        let f = file("syntax.toml", "docs = 3\npolicy = hybrid\n");
        let e = conf(&f, &[]).unwrap_err();
        assert!(
            e.starts_with(&format!("{}:2: not TOML", f.0.display())),
            "{e}"
        );
        assert!(e.contains("quote text values"), "{e}");

        let f = file("dup.toml", "docs = 3\ndocs = 4\n");
        assert!(conf(&f, &[]).unwrap_err().contains(":2: not TOML"));

        let e =
            load_from::<Conf>(Some(Path::new("/nonexistent/t.toml")), "T", env(&[])).unwrap_err();
        assert!(e.contains("/nonexistent/t.toml: cannot read"), "{e}");

        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Needs {
            root: String,
        }
        let f = file("missing.toml", "\n");
        let e = load_from::<Needs>(Some(&f.0), "T", env(&[])).unwrap_err();
        assert!(
            e.contains("missing field `root`") && e.contains("add the key"),
            "{e}"
        );
    }

    #[test]
    fn variable_errors_name_the_variable_and_the_fix() {
        let f = file("var.toml", GOOD);
        let e = conf(&f, &[("TOOL_DOCS", "many")]).unwrap_err();
        assert!(
            e.starts_with("environment TOOL_DOCS=\"many\": key `docs`:"),
            "{e}"
        );
        assert!(e.contains("or unset TOOL_DOCS"), "{e}");

        // A misspelt variable is refused, not ignored.
        let e = conf(&f, &[("TOOL_DOX", "4")]).unwrap_err();
        assert!(
            e.starts_with("environment TOOL_DOX=\"4\": key `dox`: unknown field"),
            "{e}"
        );

        let e = conf(&f, &[("TOOL_A.B", "1")]).unwrap_err();
        assert!(
            e.contains("environment TOOL_A.B: not a setting name"),
            "{e}"
        );

        // A list variable with a bad item: the variable, not the file.
        let e = conf(&f, &[("TOOL_ALLOW", "[1]")]).unwrap_err();
        assert!(e.starts_with("environment TOOL_ALLOW="), "{e}");
    }

    #[test]
    fn sizes_and_a_fields_own_fix() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Sized {
            #[serde(deserialize_with = "crate::de::size")]
            cache: u64,
            #[serde(default, deserialize_with = "crate::de::opt_size")]
            window: Option<u64>,
        }
        let f = file("size.toml", "cache = \"64M\"\n");
        let c: Sized = load_from(Some(&f.0), "T", env(&[])).unwrap();
        assert_eq!((c.cache, c.window), (64 << 20, None));
        // A variable's number and a variable's text are both sizes.
        let c: Sized = load_from(
            Some(&f.0),
            "T",
            env(&[("T_CACHE", "4096"), ("T_WINDOW", "1GiB")]),
        )
        .unwrap();
        assert_eq!((c.cache, c.window), (4096, Some(1 << 30)));

        // The field's own fix is the one shown, once, with where and the key.
        let f = file("badsize.toml", "# x\ncache = \"1.5M\"\n");
        let e = load_from::<Sized>(Some(&f.0), "T", env(&[])).unwrap_err();
        assert!(
            e.starts_with(&format!("{}:2: key `cache`: invalid size", f.0.display())),
            "{e}"
        );
        assert!(
            e.ends_with("(fix: give bytes, or a size such as 64M)"),
            "{e}"
        );
        assert_eq!(e.matches("fix:").count(), 1, "{e}");
        let e = load_from::<Sized>(Some(&f.0), "T", env(&[("T_CACHE", "true")])).unwrap_err();
        assert!(
            e.starts_with("environment T_CACHE=\"true\": key `cache`: expected a size"),
            "{e}"
        );
        assert!(e.contains("\"64M\""), "{e}");
    }

    #[test]
    fn lenient_leaves_out_each_bad_setting_and_applies_the_rest() {
        // A file with one line of each kind of trouble among good ones.
        let f = file(
            "lenient.toml",
            "docs = 5\ndox = 4\nratio = \"half\"\npolicy = hybrid\ncrc = true\n",
        );
        let (c, errors): (Conf, _) = load_lenient_from(
            Some(&f.0),
            "TOOL",
            env(&[
                ("TOOL_LISTEN", "\"[::1]:9\""),
                ("TOOL_DOCS", "many"),
                ("TOOL_DOX", "1"),
                ("TOOL_A.B", "1"),
            ]),
        );
        assert_eq!(
            (c.docs, c.crc, c.listen.as_str(), c.ratio, c.policy),
            (5, true, "[::1]:9", 0.0, None),
            "{errors:#?}"
        );
        let name = f.0.display().to_string();
        let want = [
            "environment TOOL_A.B: not a setting name",
            &format!("{name}:4: not TOML"),
            "environment TOOL_DOCS=\"many\": key `docs`:",
            "environment TOOL_DOX=\"1\": key `dox`: unknown field",
            &format!("{name}:2: key `dox`: unknown field"),
            &format!("{name}:3: key `ratio`:"),
        ];
        assert_eq!(errors.len(), want.len(), "{errors:#?}");
        for w in want {
            assert!(
                errors
                    .iter()
                    .any(|e| e.starts_with(w) && e.contains("(fix: ")),
                "no error starting {w:?} with a fix in {errors:#?}"
            );
        }
        // Each error once: the same setting is not reported twice.
        let mut seen = errors.clone();
        seen.dedup();
        assert_eq!(seen.len(), errors.len());
    }

    #[test]
    fn lenient_without_a_readable_file_takes_the_environment() {
        let (c, errors): (Conf, _) = load_lenient_from(
            Some(Path::new("/nonexistent/t.toml")),
            "TOOL",
            env(&[("TOOL_DOCS", "3")]),
        );
        assert_eq!(c.docs, 3);
        assert_eq!(errors.len(), 1, "{errors:#?}");
        assert!(
            errors[0].starts_with("/nonexistent/t.toml: cannot read"),
            "{errors:#?}"
        );
        // A file that is not TOML at all: three lines, then one line for
        // the file, not one for each of its lines.
        let f = file("lenient-prose.toml", "a b\nc d\ne f\ng h\ni j\n");
        let (c, errors): (Conf, _) =
            load_lenient_from(Some(&f.0), "TOOL", env(&[("TOOL_DOCS", "3")]));
        assert_eq!(c.docs, 3);
        assert_eq!(errors.len(), 4, "{errors:#?}");
        assert!(
            errors[3].contains("3 lines are not TOML: the whole file is ignored"),
            "{errors:#?}"
        );
        // Nothing wrong: nothing reported, as load_from.
        let f = file("lenient-good.toml", GOOD);
        let (c, errors): (Conf, _) = load_lenient_from(Some(&f.0), "TOOL", env(&[]));
        assert!(errors.is_empty(), "{errors:#?}");
        assert_eq!(Ok(c), conf(&f, &[]));
    }
}
