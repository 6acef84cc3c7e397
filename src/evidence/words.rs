//! `words!` and `vocabulary!`: an enum whose values are written as words (in a report, in a
//! trace header), each word written beside its variant. Words are matched, never looked up by
//! list position, so adding or reordering a variant cannot give another its word; a word
//! written twice is an unreachable pattern.

/// The Python constant for a word or a key: upper-cased, each character that is neither a letter
/// nor a digit an underscore (`deepspeed-zero0` is `DEEPSPEED_ZERO0`, `per tensor` `PER_TENSOR`,
/// `world_size` `WORLD_SIZE`, the Rust const's name).
pub fn python_name(word: &str) -> String {
    word.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect()
}

/// An enum of words: `pub enum Stage { Samples = "samples", ... }` gives the enum, `ALL` and
/// `WORDS` in declaration order, `parse` and `name` by match, and serde's writing as the word.
/// The judge's vocabularies (reasons, stages, mechanisms) are these; a header's are
/// [`vocabulary!`]s, which add the header's reading and writing.
macro_rules! words {
    (
        $(#[$meta:meta])*
        pub enum $ty:ident {
            $($(#[$vmeta:meta])* $variant:ident = $word:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $ty {
            $($(#[$vmeta])* $variant,)+
        }

        impl $ty {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];
            /// Every word, in declaration order.
            pub const WORDS: &'static [&'static str] = &[$($word),+];

            /// The variant `word` names.
            pub fn parse(word: &str) -> Option<$ty> {
                match word {
                    $($word => Some($ty::$variant),)+
                    _ => None,
                }
            }

            /// Its word.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $word,)+
                }
            }
        }

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }
    };
}

/// An enum of header words: [`words!`] and its `HeaderValue` (one of `WORDS`).
macro_rules! vocabulary {
    (
        $(#[$meta:meta])*
        pub enum $ty:ident {
            $($(#[$vmeta:meta])* $variant:ident = $word:literal,)+
        }
    ) => {
        $crate::evidence::words::words! {
            $(#[$meta])*
            pub enum $ty {
                $($(#[$vmeta])* $variant = $word,)+
            }
        }

        impl $crate::evidence::keys::HeaderValue for $ty {
            const VALUE: $crate::evidence::keys::Value = $crate::evidence::keys::Value::OneOf(
                $crate::evidence::keys::Words { class: stringify!($ty), words: $ty::WORDS },
            );

            fn read(v: &str) -> Option<$ty> {
                $ty::parse(v)
            }

            fn write(&self) -> String {
                self.name().to_string()
            }
        }
    };
}

pub(crate) use {vocabulary, words};

#[cfg(test)]
mod tests {
    use super::*;

    vocabulary! {
        /// A throwaway engine vocabulary: a new engine's Rust side is one more variant.
        pub enum Throwaway {
            Ddp = "ddp",
            Throwaway = "throwaway",
        }
    }

    /// One variant line gives the word its list entry, its reading, its writing and the
    /// header value's check, whatever its position.
    #[test]
    fn a_new_word_is_one_variant() {
        use crate::evidence::keys::{HeaderValue, Value};
        assert_eq!(Throwaway::WORDS, ["ddp", "throwaway"]);
        for v in Throwaway::ALL {
            assert_eq!(Throwaway::parse(v.name()), Some(*v));
            assert_eq!(Throwaway::read(&v.write()), Some(*v));
        }
        assert!(matches!(Throwaway::VALUE, Value::OneOf(w) if w.class == "Throwaway" && w.words == Throwaway::WORDS));
        assert_eq!(python_name(Throwaway::Throwaway.name()), "THROWAWAY");
    }

    #[test]
    fn python_names_are_the_word_upper_cased() {
        assert_eq!(python_name("deepspeed-zero0"), "DEEPSPEED_ZERO0");
        assert_eq!(python_name("per tensor"), "PER_TENSOR");
        assert_eq!(python_name("world_size"), "WORLD_SIZE");
    }
}
