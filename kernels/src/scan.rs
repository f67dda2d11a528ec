//! Reads facts out of CUDA C text: the `extern "C" __global__` functions a file defines and
//! its `#define NAME <integer>` constants. Good enough for our own sources (one declaration per
//! line, no macros that generate kernels); not a C parser.

/// The names of the `__global__` functions defined in `text`, in order of appearance.
pub fn global_functions(text: &str) -> Vec<&str> {
    let mut names = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let Some(at) = code.find("__global__") else {
            continue;
        };
        let rest = &code[at + "__global__".len()..];
        let Some(open) = rest.find('(') else {
            continue;
        };
        if let Some(name) = rest[..open].split_whitespace().last() {
            names.push(name.trim_start_matches('*'));
        }
    }
    names
}

/// The value of `#define NAME <integer>` in `text`, if it is defined that way.
pub fn integer_define(text: &str, name: &str) -> Option<i64> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("#define") && words.next() == Some(name))
            .then(|| words.next()?.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_globals_and_defines() {
        let text = "#define THREADS 256\n#define NAME_ONLY\n\
            extern \"C\" __global__ void a_f32(float* x) { }\n\
            // __global__ void commented_out(\n\
            __device__ void helper(int) {}\n\
            extern \"C\" __global__ void b(int n) {}\n";
        assert_eq!(global_functions(text), vec!["a_f32", "b"]);
        assert_eq!(integer_define(text, "THREADS"), Some(256));
        assert_eq!(integer_define(text, "NAME_ONLY"), None);
        assert_eq!(integer_define(text, "MISSING"), None);
    }
}
