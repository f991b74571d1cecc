//! The shape of the code (issue 25): no function outside test modules longer than 150 lines,
//! and no two source files that import each other, directly or through others (`crate::` and
//! `super::` paths outside test modules; layers depend downward only).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

const MAX_FN_LINES: usize = 150;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file of the library (src/ and the pass registry in passes/) with its module path.
fn sources() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for (top, prefix) in [("src", ""), ("passes", "passes")] {
        let mut stack = vec![root().join(top)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).expect("a source folder") {
                let p = e.expect("an entry").path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let rel = p.strip_prefix(root().join(top)).unwrap().with_extension("");
                    let mut parts: Vec<String> = std::iter::once(prefix.to_string())
                        .chain(rel.iter().map(|c| c.to_string_lossy().into_owned()))
                        .filter(|s| !s.is_empty())
                        .collect();
                    if matches!(
                        parts.last().map(String::as_str),
                        Some("mod" | "lib" | "main")
                    ) {
                        parts.pop();
                    }
                    out.push((parts.join("::"), p));
                }
            }
        }
    }
    out.sort();
    out
}

/// The file's lines outside `#[cfg(test)] mod … { … }` blocks (blanked, so line numbers hold).
fn non_test_lines(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    let mut i = 0;
    while i < lines.len() {
        let next_is_mod = lines.get(i + 1).is_some_and(|l| {
            l.trim_start().starts_with("mod ") || l.trim_start().starts_with("pub(crate) mod ")
        });
        if lines[i].trim() == "#[cfg(test)]" && next_is_mod {
            let indent = &lines[i + 1][..lines[i + 1].len() - lines[i + 1].trim_start().len()];
            let mut j = i + 1;
            while j < lines.len() && lines[j] != format!("{indent}}}") {
                out[j].clear();
                j += 1;
            }
            for l in out.iter_mut().take((j + 1).min(lines.len())).skip(i) {
                l.clear();
            }
            i = j + 1;
            continue;
        }
        i += 1;
    }
    out
}

#[test]
fn no_function_outside_tests_is_longer_than_150_lines() {
    let mut long = Vec::new();
    for (_, path) in sources() {
        let text = std::fs::read_to_string(&path).unwrap();
        let lines = non_test_lines(&text);
        for (i, l) in lines.iter().enumerate() {
            let t = l.trim_start();
            let is_fn = [
                "fn ",
                "pub fn ",
                "pub(crate) fn ",
                "pub(super) fn ",
                "const fn ",
                "pub const fn ",
            ]
            .iter()
            .any(|p| t.starts_with(p));
            if !is_fn || t.ends_with(';') {
                continue;
            }
            // rustfmt closes a function at the indentation it opened at.
            let close = format!("{}}}", &l[..l.len() - t.len()]);
            if let Some(end) = lines[i + 1..].iter().position(|x| *x == close) {
                let n = end + 2;
                if n > MAX_FN_LINES {
                    long.push(format!("{}:{} ({n} lines)", path.display(), i + 1));
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines: {long:#?}"
    );
}

#[test]
fn no_two_files_import_each_other() {
    let files = sources();
    let modules: BTreeSet<&str> = files.iter().map(|(m, _)| m.as_str()).collect();
    let mut deps: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (m, path) in &files {
        let text = non_test_lines(&std::fs::read_to_string(path).unwrap()).join("\n");
        let here: Vec<&str> = if m.is_empty() {
            Vec::new()
        } else {
            m.split("::").collect()
        };
        for (kw, base) in [
            ("crate::", Vec::new()),
            ("super::", here[..here.len().saturating_sub(1)].to_vec()),
        ] {
            for (pos, _) in text.match_indices(kw) {
                // Skip comments: the line's text before the path holds `//`.
                let line_start = text[..pos].rfind('\n').map_or(0, |i| i + 1);
                if text[line_start..pos].contains("//") {
                    continue;
                }
                let rest: String = text[pos + kw.len()..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                let mut path: Vec<&str> = base.clone();
                path.extend(rest.split("::").filter(|s| !s.is_empty()));
                for k in (1..=path.len()).rev() {
                    let cand = path[..k].join("::");
                    if let Some(&c) = modules.get(cand.as_str()) {
                        if c != m.as_str() {
                            deps.entry(m.as_str()).or_default().insert(c);
                        }
                        break;
                    }
                }
            }
        }
    }
    // A circle: a module reachable from one of its own dependencies.
    let mut circles = BTreeSet::new();
    for (&m, ds) in &deps {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<&str> = ds.iter().copied().collect();
        while let Some(x) = stack.pop() {
            if x == m {
                circles.insert(m);
                break;
            }
            if seen.insert(x) {
                stack.extend(deps.get(x).into_iter().flatten().copied());
            }
        }
    }
    assert!(
        circles.is_empty(),
        "modules on an import circle: {circles:?}"
    );
}
