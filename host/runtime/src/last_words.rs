//! What a guest said on stderr just before it trapped, in the words of its
//! own language: a Rust panic's message, a Python traceback's exception and
//! innermost frame, a JavaScript error's message and top of its stack. The
//! trap itself only says `unreachable`; this is what a user needs to fix it.
//! Pure text work, bounded, so it can be tested on captured output.

/// Most characters of last words kept in a trap's message.
pub(crate) const MAX_LAST_WORDS: usize = 512;

/// What the guest said before trapping, if it said anything recognisable.
pub(crate) fn last_words(stderr: &str) -> Option<String> {
    let said = python(stderr)
        .or_else(|| javascript(stderr))
        .or_else(|| rust(stderr))?;
    Some(bounded(&said))
}

/// A Python traceback (componentize-py prints it before its runtime
/// panics): the exception line and the innermost frame.
fn python(stderr: &str) -> Option<String> {
    let at = stderr.rfind("Traceback (most recent call last):")?;
    let lines: Vec<&str> = stderr[at..].lines().skip(1).collect();
    // Frames and their source lines are indented; the exception is the
    // first line that is not (a chained exception starts a new traceback,
    // and `rfind` took the last one).
    let exception = lines
        .iter()
        .position(|l| !l.starts_with(' ') && !l.trim().is_empty())?;
    let frame = lines[..exception]
        .iter()
        .rev()
        .find(|l| l.trim_start().starts_with("File "))
        .map(|l| l.trim());
    let mut message = format!("raised {}", lines[exception].trim());
    // A multi-line message continues until the runtime's own panic line.
    for more in lines[exception + 1..]
        .iter()
        .take_while(|l| !l.starts_with("thread '") && !l.trim().is_empty())
        .take(3)
    {
        message.push(' ');
        message.push_str(more.trim());
    }
    if let Some(frame) = frame {
        message.push_str(&format!(" ({frame})"));
    }
    Some(message)
}

/// A JavaScript exception (componentize-js): the value thrown, and the top
/// of the stack it printed.
fn javascript(stderr: &str) -> Option<String> {
    let stack_at = stderr.rfind("Stack:")?;
    let before = &stderr[..stack_at];
    let head = before.lines().rev().find(|l| !l.trim().is_empty())?.trim();
    // A value thrown from an export returning `result` that is not a
    // plugin error: componentize-js names it as `received `…``.
    let thrown = head
        .split_once("(received `")
        .and_then(|(_, rest)| rest.rsplit_once("`)"))
        .map_or(head, |(thrown, _)| thrown);
    let frames: Vec<&str> = stderr[stack_at + "Stack:".len()..]
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Redirecting call to abort()"))
        .take(2)
        .collect();
    let mut message = format!("threw {thrown}");
    if !frames.is_empty() {
        message.push_str(&format!(" (at {})", frames.join(" < ")));
    }
    Some(message)
}

/// A Rust panic: its location and message, before any `note:` hint.
fn rust(stderr: &str) -> Option<String> {
    let at = stderr.rfind("panicked at")?;
    let panic: Vec<&str> = stderr[at..]
        .lines()
        .take_while(|l| !l.starts_with("note:"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(4)
        .collect();
    Some(panic.join(" "))
}

fn bounded(text: &str) -> String {
    if text.chars().count() <= MAX_LAST_WORDS {
        return text.to_string();
    }
    let cut: String = text.chars().take(MAX_LAST_WORDS).collect();
    format!("{cut}… (cut)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_python_traceback_gives_the_exception_and_the_innermost_frame() {
        let stderr = "Traceback (most recent call last):\n  File \"/0/app.py\", line 20, in render\n    helper()\n  File \"/0/app.py\", line 13, in helper\n    raise ValueError('x')\nValueError: exploded on purpose\nthread '<unnamed>' (1) panicked at runtime/src/lib.rs:1293:29:\nPython function threw an unexpected exception\nnote: run with `RUST_BACKTRACE=1`\n";
        assert_eq!(
            last_words(stderr).unwrap(),
            "raised ValueError: exploded on purpose (File \"/0/app.py\", line 13, in helper)"
        );
    }

    #[test]
    fn a_javascript_throw_gives_the_value_and_the_top_of_the_stack() {
        let stderr = "invalid variant tag value `undefined` (received `Error: exploded on purpose`) specified for `PluginError`\nStack:\n  export_addon_0_1_0$render@/tmp/x/initializer.js:427:17\nRedirecting call to abort() to mozalloc_abort\n";
        assert_eq!(
            last_words(stderr).unwrap(),
            "threw Error: exploded on purpose (at export_addon_0_1_0$render@/tmp/x/initializer.js:427:17)"
        );
        let plain = "TypeError: spec.nope is undefined\nStack:\n  render@addon.js:5:9\n  call@addon.js:9:3\n  outer@addon.js:12:1\n";
        assert_eq!(
            last_words(plain).unwrap(),
            "threw TypeError: spec.nope is undefined (at render@addon.js:5:9 < call@addon.js:9:3)"
        );
    }

    #[test]
    fn a_rust_panic_gives_its_location_and_message() {
        let stderr = "thread '<unnamed>' panicked at src/lib.rs:10:5:\nboom\nnote: run with `RUST_BACKTRACE=1`";
        assert_eq!(
            last_words(stderr).unwrap(),
            "panicked at src/lib.rs:10:5: boom"
        );
        assert_eq!(last_words("just some logging\n"), None);
    }

    #[test]
    fn last_words_are_bounded() {
        let stderr = format!(
            "Traceback (most recent call last):\nValueError: {}\n",
            "x".repeat(10_000)
        );
        let words = last_words(&stderr).unwrap();
        assert!(
            words.chars().count() <= MAX_LAST_WORDS + 8,
            "{}",
            words.len()
        );
        assert!(words.ends_with("(cut)"));
    }
}
