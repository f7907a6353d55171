//! Configuration files of `ccappd`, `ccproxy` and `ccupdate`: TOML, as
//! rftp's (`rftpd --config`), with flags overriding the file.
//!
//! The file's keys are the program's long flags, in TOML's snake_case or
//! as written on the command line (`push_policy` or `push-policy`):
//!
//! ```toml
//! docs = 1024
//! push_policy = "hybrid"
//! hybrid_percent = 10
//! init_docs = true                        # a switch: true sets it
//! ipc_allow_user = ["www-data", "nobody"] # a repeatable flag
//! ```
//!
//! The flags themselves are the schema: a key that is not a long flag of
//! the program is refused with its name, a switch takes `true` or
//! `false`, and each value is checked by the same parser as on the
//! command line (the file's settings become flags placed before the
//! command line's own, and a later flag wins: `args_override_self`).
//!
//! The old syntax (`key = value` lines with bare text values, such as
//! `push-policy = hybrid`) is still read in this release, with a warning
//! that names the fix; it will be refused in the next one.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{ArgAction, Command};

/// The command line with the settings of its `--config FILE` (if any)
/// turned into flags in front of it, so that a flag on the command line
/// wins. `cmd` is the program's `clap` command (`Args::command()`): its
/// long flags are the keys the file may use. A file in the old syntax is
/// read with a deprecation warning (logged).
pub fn args_with_config(cmd: &Command, args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let loaded = load(cmd, args)?;
    if let Some(w) = &loaded.deprecated {
        tracing::warn!("{w}");
    }
    Ok(loaded.args)
}

/// What [`load`] made of a command line.
#[derive(Debug)]
pub struct Loaded {
    /// The file's settings as flags, then the command line's arguments.
    pub args: Vec<OsString>,
    /// Set when the file is in the old `key = value` syntax: the warning.
    pub deprecated: Option<String>,
}

/// [`args_with_config`] without the logging.
pub fn load(cmd: &Command, args: Vec<OsString>) -> Result<Loaded, String> {
    let Some(path) = config_path(&args) else {
        return Ok(Loaded {
            args,
            deprecated: None,
        });
    };
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("--config {}: {e}", path.display()))?;
    let (flags, deprecated) = match text.parse::<toml::Table>() {
        Ok(t) => (toml_flags(cmd, &path, &t)?, None),
        Err(toml_err) => match legacy_flags(&path, &text) {
            Ok(flags) => (
                flags,
                Some(format!(
                    "--config {}: the `key = value` syntax with bare values is deprecated and will be \
                     refused in the next release; the file was read as before. Make it TOML: quote \
                     text values (push_policy = \"hybrid\"), keep numbers and true/false bare, \
                     list a repeated flag as [\"a\", \"b\"] (docs/CACHE.md, Configuration files)",
                    path.display()
                )),
            ),
            Err(_) => return Err(format!("--config {}: not TOML: {toml_err}", path.display())),
        },
    };
    let mut out = vec![args[0].clone()];
    out.extend(flags);
    out.extend(args.into_iter().skip(1));
    Ok(Loaded {
        args: out,
        deprecated,
    })
}

/// The `--config FILE` / `--config=FILE` of a command line (the last one).
fn config_path(args: &[OsString]) -> Option<PathBuf> {
    let mut path = None;
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let a = a.to_string_lossy();
        if a == "--config" {
            path = it.next().map(PathBuf::from);
        } else if let Some(p) = a.strip_prefix("--config=") {
            path = Some(p.into());
        }
    }
    path
}

/// A TOML table's settings as flags of `cmd`.
fn toml_flags(cmd: &Command, path: &Path, t: &toml::Table) -> Result<Vec<OsString>, String> {
    let mut out = Vec::new();
    for (key, value) in t {
        let flag = key.replace('_', "-");
        let at = |why: String| format!("--config {}: key `{key}`: {why}", path.display());
        let Some(arg) = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(flag.as_str()) && flag != "config")
        else {
            return Err(at(format!(
                "not a flag of {} (the keys are its long flags: `{} --help`)",
                cmd.get_name(),
                cmd.get_name()
            )));
        };
        let switch = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
        let repeatable = matches!(arg.get_action(), ArgAction::Append);
        match value {
            toml::Value::Boolean(on) if switch => {
                if *on {
                    out.push(format!("--{flag}").into());
                }
            }
            _ if switch => return Err(at("a switch: write true or false".into())),
            toml::Value::Array(items) if repeatable => {
                for item in items {
                    out.push(format!("--{flag}").into());
                    out.push(scalar(item).map_err(&at)?.into());
                }
            }
            v => {
                out.push(format!("--{flag}").into());
                out.push(scalar(v).map_err(&at)?.into());
            }
        }
    }
    Ok(out)
}

/// A TOML value as the text of a flag's value.
fn scalar(v: &toml::Value) -> Result<String, String> {
    match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        other => Err(format!(
            "a {} where a text, a number or true/false is expected (a list only for a flag that may be repeated)",
            other.type_str()
        )),
    }
}

/// The old syntax: each line `key = value` becomes `--key value`
/// (`key = true` becomes `--key`, `key = false` is left out; blank lines
/// and `#` comments are skipped).
fn legacy_flags(path: &Path, text: &str) -> Result<Vec<OsString>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (k, v) = line.split_once('=').ok_or_else(|| {
            format!(
                "{}:{}: expected `key = value`, got {line:?}",
                path.display(),
                n + 1
            )
        })?;
        let (k, v) = (k.trim(), v.trim().trim_matches('"'));
        if k.is_empty() || k == "config" {
            return Err(format!("{}:{}: bad key {k:?}", path.display(), n + 1));
        }
        match v {
            "true" => out.push(format!("--{k}").into()),
            "false" => {}
            v => {
                out.push(format!("--{k}").into());
                out.push(v.into());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    /// A program with each kind of flag.
    #[derive(Parser, Debug)]
    #[command(name = "ccfake", args_override_self = true)]
    struct Fake {
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long, default_value_t = 64)]
        docs: u32,
        #[arg(long)]
        push_policy: Option<String>,
        #[arg(long)]
        ratio: Option<f64>,
        #[arg(long)]
        init_docs: bool,
        #[arg(long)]
        verbose: bool,
        #[arg(long)]
        ipc_allow_user: Vec<String>,
    }

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn file(name: &str, text: &str) -> (Dir, String) {
        let dir = std::env::temp_dir().join(format!("ccache-cfg-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join(name);
        std::fs::write(&f, text).unwrap();
        (Dir(dir), f.to_str().unwrap().to_owned())
    }

    fn parse(args: &[&str]) -> Result<(Fake, Option<String>), String> {
        let l = load(&Fake::command(), os(args))?;
        let f = Fake::try_parse_from(l.args).map_err(|e| e.to_string())?;
        Ok((f, l.deprecated))
    }

    #[test]
    fn toml_file_with_flags_overriding_it() {
        let (_d, f) = file(
            "a.toml",
            "# ccappd\ndocs = 1024\npush_policy = \"hybrid\" # either spelling\n\
             ratio = 0.5\ninit-docs = true\nverbose = false\n\
             ipc_allow_user = [\"www-data\", \"nobody\"]\n",
        );
        let (a, dep) = parse(&["ccfake", "--config", &f]).unwrap();
        assert_eq!(dep, None, "a TOML file is not deprecated");
        assert_eq!(a.docs, 1024);
        assert_eq!(a.push_policy.as_deref(), Some("hybrid"));
        assert_eq!(a.ratio, Some(0.5));
        assert!(a.init_docs && !a.verbose);
        assert_eq!(a.ipc_allow_user, ["www-data", "nobody"]);
        // The command line wins, wherever --config is.
        let (a, _) = parse(&["ccfake", "--docs", "3", &format!("--config={f}")]).unwrap();
        assert_eq!(a.docs, 3);
        let (a, _) = parse(&["ccfake", "--config", &f, "--push-policy", "pull"]).unwrap();
        assert_eq!(a.push_policy.as_deref(), Some("pull"));
        // No --config: the command line as it is.
        assert_eq!(
            load(&Fake::command(), os(&["x", "--docs", "3"]))
                .unwrap()
                .args,
            os(&["x", "--docs", "3"])
        );
    }

    #[test]
    fn toml_errors_name_the_key_and_the_fix() {
        let cmd = Fake::command();
        let (_d, f) = file("b.toml", "dox = 3\n");
        let e = load(&cmd, os(&["x", "--config", &f])).unwrap_err();
        assert!(
            e.contains("key `dox`") && e.contains("ccfake --help"),
            "{e}"
        );
        let (_d, f) = file("c.toml", "init_docs = \"yes\"\n");
        let e = load(&cmd, os(&["x", "--config", &f])).unwrap_err();
        assert!(
            e.contains("`init_docs`: a switch: write true or false"),
            "{e}"
        );
        let (_d, f) = file("d.toml", "docs = [1, 2]\n");
        let e = load(&cmd, os(&["x", "--config", &f])).unwrap_err();
        assert!(
            e.contains("a list only for a flag that may be repeated"),
            "{e}"
        );
        let (_d, f) = file("e.toml", "config = \"other.toml\"\n");
        assert!(load(&cmd, os(&["x", "--config", &f])).is_err());
        // A value of the wrong type fails like the same flag on the command line.
        let (_d, f) = file("f.toml", "docs = \"many\"\n");
        let e = parse(&["ccfake", "--config", &f]).unwrap_err();
        assert!(e.contains("--docs"), "{e}");
        // Neither TOML nor the old syntax: the TOML error, with its line.
        let (_d, f) = file("g.toml", "docs = 3\nnonsense\n");
        let e = load(&cmd, os(&["x", "--config", &f])).unwrap_err();
        assert!(e.contains("not TOML") && e.contains("line 2"), "{e}");
        assert!(load(&cmd, os(&["x", "--config", "/nonexistent/c"]))
            .unwrap_err()
            .contains("/nonexistent/c"));
    }

    #[test]
    fn old_syntax_is_read_with_a_deprecation_warning() {
        let (_d, f) = file(
            "old.conf",
            "# push\npush-policy = hybrid\ndocs=30 # hot\n\ninit-docs = true\nverbose = false\n",
        );
        let (a, dep) = parse(&["ccfake", "--config", &f, "--docs", "10"]).unwrap();
        assert_eq!(a.push_policy.as_deref(), Some("hybrid"));
        assert_eq!(a.docs, 10, "the command line wins");
        assert!(a.init_docs && !a.verbose);
        let dep = dep.expect("a deprecation warning");
        assert!(
            dep.contains("deprecated") && dep.contains("push_policy = \"hybrid\""),
            "{dep}"
        );
        // The same settings, in the order the old parser gave them.
        assert_eq!(
            load(&Fake::command(), os(&["x", "--config", &f]))
                .unwrap()
                .args,
            os(&[
                "x",
                "--push-policy",
                "hybrid",
                "--docs",
                "30",
                "--init-docs",
                "--config",
                &f
            ])
        );
    }
}
