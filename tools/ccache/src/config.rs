//! Configuration of `ccappd`, `ccproxy` and `ccupdate`: a TOML file
//! (`--config FILE`) and `PROGRAM_KEY=value` environment variables, read
//! by the shared loader `iwarp_conf::load` (as rftp's could be), with
//! flags overriding both. Precedence, highest first: **flags >
//! environment > file > defaults**.
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
//! and so are the variables' after the program's name in capitals
//! (`CCAPPD_PUSH_POLICY=hybrid`, `CCPROXY_CACHE_BYTES=67108864`), which replace
//! the file's setting of that key (see iwarp-conf for how a value is read).
//!
//! The flags themselves are the schema: a key that is not a long flag of
//! the program is refused with its name (and its line, or its variable),
//! a switch takes `true` or `false`, and each value is checked by the same
//! parser as on the command line (the settings become flags placed before
//! the command line's own, and a later flag wins: `args_override_self`).
//!
//! The old syntax (`key = value` lines with bare text values, such as
//! `push-policy = hybrid`) is still read in this release, with a warning
//! that names the fix; it will be refused in the next one.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{ArgAction, Command};

/// The command line with the settings of its `--config FILE` (if any)
/// and of the `{env_prefix}_KEY` variables turned into flags in front of
/// it, so that a flag on the command line wins. `cmd` is the program's
/// `clap` command (`Args::command()`): its long flags are the keys the
/// file and the variables may use. A file in the old syntax is read with a
/// deprecation warning (logged).
pub fn args_with_config(
    cmd: &Command,
    env_prefix: &str,
    args: Vec<OsString>,
) -> Result<Vec<OsString>, String> {
    let loaded = load(cmd, env_prefix, args, std::env::vars_os())?;
    if let Some(w) = &loaded.deprecated {
        tracing::warn!("{w}");
    }
    Ok(loaded.args)
}

/// What [`load`] made of a command line.
#[derive(Debug)]
pub struct Loaded {
    /// The file's and the environment's settings as flags, then the
    /// command line's arguments.
    pub args: Vec<OsString>,
    /// Set when the file is in the old `key = value` syntax: the warning.
    pub deprecated: Option<String>,
}

/// [`args_with_config`] with the environment given and without the
/// logging.
pub fn load(
    cmd: &Command,
    env_prefix: &str,
    args: Vec<OsString>,
    env: impl IntoIterator<Item = (OsString, OsString)>,
) -> Result<Loaded, String> {
    let env: Vec<(OsString, OsString)> = env.into_iter().collect();
    let path = config_path(&args);
    let text = match &path {
        Some(p) => {
            std::fs::read_to_string(p).map_err(|e| format!("--config {}: {e}", p.display()))?
        }
        None => String::new(),
    };
    let src = Source {
        path: path.as_deref(),
        text: &text,
        env: &env,
        prefix: env_prefix,
    };
    let mut deprecated = None;
    let flags = match (&path, text.parse::<toml::Table>()) {
        (Some(p), Err(_)) => {
            // The old syntax, then the variables (they override the file).
            let Ok(mut flags) = legacy_flags(p, &text) else {
                // Neither: the loader's error, with the line and the fix.
                let e = iwarp_conf::load_from::<toml::Table>(Some(p), "", []).err();
                return Err(format!("--config {}", e.unwrap_or_default()));
            };
            deprecated = Some(format!(
                "--config {}: the `key = value` syntax with bare values is deprecated and will be \
                 refused in the next release; the file was read as before. Make it TOML: quote \
                 text values (push_policy = \"hybrid\"), keep numbers and true/false bare, \
                 list a repeated flag as [\"a\", \"b\"] (docs/CACHE.md, Configuration files)",
                p.display()
            ));
            let vars: toml::Table = iwarp_conf::load_from(None, env_prefix, env.clone())?;
            flags.extend(toml_flags(cmd, &src, &vars)?);
            flags
        }
        _ => {
            let t: toml::Table = iwarp_conf::load_from(path.as_deref(), env_prefix, env.clone())
                .map_err(|e| match e.starts_with("environment ") {
                    true => e,
                    false => format!("--config {e}"),
                })?;
            toml_flags(cmd, &src, &t)?
        }
    };
    let mut out = vec![args[0].clone()];
    out.extend(flags);
    out.extend(args.into_iter().skip(1));
    Ok(Loaded {
        args: out,
        deprecated,
    })
}

/// Where the settings came from, to name it in an error.
struct Source<'a> {
    path: Option<&'a Path>,
    text: &'a str,
    env: &'a [(OsString, OsString)],
    prefix: &'a str,
}

impl Source<'_> {
    /// `--config FILE:LINE` or `environment VAR` for a key.
    fn of(&self, key: &str) -> String {
        let var = format!("{}_{}", self.prefix, key.to_ascii_uppercase());
        if !self.prefix.is_empty() && self.env.iter().any(|(k, _)| *k == *var) {
            return format!("environment {var}");
        }
        let path = self
            .path
            .map_or_else(String::new, |p| p.display().to_string());
        // The line whose key is this one (`key =`, `"key" =`).
        let line = self.text.lines().position(|l| {
            l.trim_start()
                .trim_start_matches(['"', '\''])
                .strip_prefix(key)
                .is_some_and(|r| {
                    r.trim_start_matches(['"', '\''])
                        .trim_start()
                        .starts_with('=')
                })
        });
        match line {
            Some(n) => format!("--config {path}:{}", n + 1),
            None => format!("--config {path}"),
        }
    }
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
fn toml_flags(cmd: &Command, src: &Source, t: &toml::Table) -> Result<Vec<OsString>, String> {
    let mut out = Vec::new();
    for (key, value) in t {
        let flag = key.replace('_', "-");
        let at = |why: String| format!("{}: key `{key}`: {why}", src.of(key));
        let Some(arg) = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(flag.as_str()) && flag != "config")
        else {
            // The program's name: its variables' prefix (the command's
            // own name is the package's, `ccache`).
            let name = match src.prefix {
                "" => cmd.get_name().to_owned(),
                p => p.to_ascii_lowercase(),
            };
            return Err(at(format!(
                "not a flag of {name} (the keys are its long flags: `{name} --help`)"
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
    /// A file in a directory of its own: one per call, not per name (two
    /// tests running at once both wrote `old.conf` into one directory, and
    /// the first to finish removed it under the other).
    fn file(name: &str, text: &str) -> (Dir, String) {
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("ccache-cfg-{}-{n}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join(name);
        std::fs::write(&f, text).unwrap();
        (Dir(dir), f.to_str().unwrap().to_owned())
    }

    fn env(v: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        v.iter().map(|(k, v)| (k.into(), v.into())).collect()
    }

    /// [`load`] with the prefix CCFAKE and no variables.
    fn load(cmd: &Command, args: Vec<OsString>) -> Result<Loaded, String> {
        super::load(cmd, "CCFAKE", args, env(&[]))
    }

    fn parse(args: &[&str]) -> Result<(Fake, Option<String>), String> {
        parse_env(args, &[])
    }

    fn parse_env(args: &[&str], vars: &[(&str, &str)]) -> Result<(Fake, Option<String>), String> {
        let l = super::load(&Fake::command(), "CCFAKE", os(args), env(vars))?;
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
        let (_d, f) = file("b.toml", "docs = 3\n\ndox = 3\n");
        let e = load(&cmd, os(&["x", "--config", &f])).unwrap_err();
        assert!(
            e.starts_with(&format!("--config {f}:3: key `dox`")) && e.contains("ccfake --help"),
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
        assert!(e.starts_with(&format!("--config {f}:2: not TOML")), "{e}");
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

    #[test]
    fn environment_between_the_file_and_the_flags() {
        let (_d, f) = file(
            "env.toml",
            "docs = 1024\npush_policy = \"hybrid\"\nratio = 0.5\n",
        );
        let vars = [
            ("CCFAKE_DOCS", "7"),
            ("CCFAKE_PUSH_POLICY", "pull"), // bare text
            ("CCFAKE_INIT_DOCS", "true"),
            ("CCFAKE_IPC_ALLOW_USER", "[\"a\", \"b\"]"),
            ("OTHER_DOCS", "9"),
        ];
        let (a, _) = parse_env(&["ccfake", "--config", &f], &vars).unwrap();
        assert_eq!((a.docs, a.push_policy.as_deref()), (7, Some("pull")));
        assert_eq!(a.ratio, Some(0.5), "the file's, where no variable is set");
        assert!(a.init_docs);
        assert_eq!(a.ipc_allow_user, ["a", "b"]);
        // Flags win over the variables.
        let (a, _) = parse_env(&["ccfake", "--config", &f, "--docs", "3"], &vars).unwrap();
        assert_eq!(a.docs, 3);
        // Without a file; and over a file in the old syntax.
        let (a, _) = parse_env(&["ccfake"], &[("CCFAKE_DOCS", "5")]).unwrap();
        assert_eq!(a.docs, 5);
        let (_d, old) = file("old.conf", "push-policy = hybrid\ndocs = 30\n");
        let (a, dep) = parse_env(&["ccfake", "--config", &old], &[("CCFAKE_DOCS", "5")]).unwrap();
        assert_eq!((a.docs, a.push_policy.as_deref()), (5, Some("hybrid")));
        assert!(dep.is_some());
    }

    #[test]
    fn environment_errors_name_the_variable() {
        let cmd = Fake::command();
        let bad =
            |vars: &[(&str, &str)]| super::load(&cmd, "CCFAKE", os(&["x"]), env(vars)).unwrap_err();
        let e = bad(&[("CCFAKE_DOX", "3")]);
        assert!(
            e.starts_with("environment CCFAKE_DOX: key `dox`: not a flag") && e.contains("--help"),
            "{e}"
        );
        let e = bad(&[("CCFAKE_INIT_DOCS", "yes")]);
        assert!(
            e.starts_with("environment CCFAKE_INIT_DOCS: key `init_docs`: a switch"),
            "{e}"
        );
        let e = bad(&[("CCFAKE_A.B", "1")]);
        assert!(
            e.starts_with("environment CCFAKE_A.B: not a setting name"),
            "{e}"
        );
        // A bad value fails as the same flag on the command line does.
        let e = parse_env(&["ccfake"], &[("CCFAKE_DOCS", "many")]).unwrap_err();
        assert!(e.contains("--docs"), "{e}");
    }
}
