//! Reading structured data out of a model's free-text reply, for every
//! study whose model parts answer in JSON (the ladder's matcher and
//! compiler, τ²'s policy compiler and receipt reader).

use serde_json::Value;

/// The first balanced `{…}` object in a reply, parsed.
pub fn first_json_object(text: &str) -> Option<Value> {
    let bytes = text.as_bytes();
    let mut start = 0;
    while let Some(off) = text[start..].find('{') {
        let s = start + off;
        let (mut depth, mut in_str, mut esc) = (0i32, false, false);
        for (i, &c) in bytes.iter().enumerate().skip(s) {
            if in_str {
                match c {
                    _ if esc => esc = false,
                    b'\\' => esc = true,
                    b'"' => in_str = false,
                    _ => {}
                }
                continue;
            }
            match c {
                b'"' => in_str = true,
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        if let Ok(v) = serde_json::from_str(&text[s..=i]) {
                            return Some(v);
                        }
                        break;
                    }
                }
                _ => {}
            }
        }
        start = s + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_object_with_braces_in_strings() {
        let v = first_json_object("x {\"a\": \"}{\", \"b\": {\"c\": 1}} y").unwrap();
        assert_eq!(v["b"]["c"], 1);
        assert!(first_json_object("{broken").is_none());
    }
}
