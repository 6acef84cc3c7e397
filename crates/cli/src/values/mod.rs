//! The words a flag's value may be, each written once, beside its variant: clap parses it
//! and lists it in `--help` (the variant's doc is its help line), serde reads and writes it
//! in configs and reports, and `name()` gives it back for messages and printed commands.
//! What a value means without libtorch lives here too; the library adds libtorch's side.

use std::ffi::OsStr;
use std::marker::PhantomData;

use clap::builder::{PossibleValue, TypedValueParser};
use clap::ValueEnum;

/// A value enum whose names are written once: `Name = "name"` per variant gives clap's
/// value and alias handling, serde's name, `name()`, `ALL` and `Display`. Attributes pass
/// through (`#[derive(Default)]` on the enum, `#[default]` or `#[value(alias = "md")]` on a
/// variant).
macro_rules! values {
    (
        $(#[$meta:meta])*
        pub enum $ty:ident {
            $($(#[$vmeta:meta])* $variant:ident = $name:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
        pub enum $ty {
            $($(#[$vmeta])* #[value(name = $name)] #[serde(rename = $name)] $variant,)+
        }

        impl $ty {
            /// Every value, in the order `--help` lists them.
            pub const ALL: [$ty; [$($name),+].len()] = [$($ty::$variant),+];

            /// The value's name on the command line and in JSON.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name,)+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

mod bug;
mod device;
mod model;
mod optim;
mod precision;
mod report;

pub use bug::{Bug, Models, Side};
pub use device::{DeviceKind, DeviceRequest, KernelMode};
pub use model::{ModelKind, PartialWindow};
pub use optim::{Optimizer, Schedule};
pub use precision::{Amp, Dtype};
pub use report::Format;

/// `s` as one of `T`'s values (or aliases), else the one line clap shows after the flag:
/// `unknown model 'resnet9'; known: linear, ...`, with `more` named last (explore's `all`).
fn by_name<T: ValueEnum>(what: &str, s: &str, more: &[&str]) -> Result<T, String> {
    T::from_str(s, false).map_err(|_| {
        let known: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value())
            .filter(|v| !v.is_hide_set())
            .map(|v| v.get_name().to_string())
            .chain(more.iter().map(|m| m.to_string()))
            .collect();
        format!("unknown {what} '{s}'; known: {}", known.join(", "))
    })
}

/// The value parser of a flag that takes one of `T`'s values; `what` names them when a
/// value is refused. `--help` lists the values, with their help lines, from `T`.
pub struct Named<T> {
    what: &'static str,
    t: PhantomData<fn() -> T>,
}

impl<T> Clone for Named<T> {
    fn clone(&self) -> Self {
        Named { what: self.what, t: PhantomData }
    }
}

/// `value_parser = named::<Dtype>("dtype")`.
pub fn named<T>(what: &'static str) -> Named<T> {
    Named { what, t: PhantomData }
}

impl<T: ValueEnum + Clone + Send + Sync + 'static> TypedValueParser for Named<T> {
    type Value = T;

    fn parse_ref(&self, cmd: &clap::Command, arg: Option<&clap::Arg>, value: &OsStr) -> Result<T, clap::Error> {
        let what = self.what;
        // A function parser: clap's "invalid value 'x' for '--flag <X>': ..." around our line.
        (move |s: &str| by_name::<T>(what, s, &[])).parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(T::value_variants().iter().filter_map(|v| v.to_possible_value())))
    }
}

/// One value, or `all` of them (explore's `--model` and `--inject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick<T> {
    All,
    One(T),
}

impl<T: ValueEnum> std::fmt::Display for Pick<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pick::All => f.write_str("all"),
            Pick::One(v) => f.write_str(v.to_possible_value().as_ref().map_or("", PossibleValue::get_name)),
        }
    }
}

/// The value parser of `Pick<T>`: `all`, or one of `T`'s values.
pub struct NamedOrAll<T>(Named<T>);

impl<T> Clone for NamedOrAll<T> {
    fn clone(&self) -> Self {
        NamedOrAll(self.0.clone())
    }
}

/// `value_parser = named_or_all::<Bug>("bug")`.
pub fn named_or_all<T>(what: &'static str) -> NamedOrAll<T> {
    NamedOrAll(named(what))
}

impl<T: ValueEnum + Clone + Send + Sync + 'static> TypedValueParser for NamedOrAll<T> {
    type Value = Pick<T>;

    fn parse_ref(&self, cmd: &clap::Command, arg: Option<&clap::Arg>, value: &OsStr) -> Result<Pick<T>, clap::Error> {
        let what = self.0.what;
        let pick = move |s: &str| match s {
            "all" => Ok(Pick::All),
            _ => by_name::<T>(what, s, &["all"]).map(Pick::One),
        };
        pick.parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        let all = PossibleValue::new("all").help("each of them in turn");
        Some(Box::new(self.0.possible_values()?.chain([all])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each name, written once, is clap's, serde's and `name()`'s, and parses back to its
    /// variant: nothing can make two lists disagree.
    #[test]
    fn every_value_round_trips_through_its_one_name() {
        fn check<T>(all: &[T])
        where
            T: ValueEnum
                + serde::Serialize
                + serde::de::DeserializeOwned
                + std::fmt::Display
                + PartialEq
                + std::fmt::Debug,
        {
            assert_eq!(all, T::value_variants());
            for v in all {
                let name = v.to_string();
                assert_eq!(v.to_possible_value().unwrap().get_name(), name);
                assert_eq!(&T::from_str(&name, false).unwrap(), v);
                let json = format!("\"{name}\"");
                assert_eq!(serde_json::to_string(v).unwrap(), json, "{v:?}");
                assert_eq!(&serde_json::from_str::<T>(&json).unwrap(), v);
            }
        }
        check(&Bug::ALL);
        check(&ModelKind::ALL);
        check(&PartialWindow::ALL);
        check(&Dtype::ALL);
        check(&Amp::ALL);
        check(&Optimizer::ALL);
        check(&DeviceRequest::ALL);
        check(&DeviceKind::ALL);
        check(&KernelMode::ALL);
        check(&Format::ALL);
    }

    #[test]
    fn aliases_and_all_parse_and_unknown_values_name_the_known_ones() {
        assert_eq!(by_name::<Format>("report format", "md", &[]), Ok(Format::Markdown));
        let err = by_name::<Format>("report format", "html", &[]).unwrap_err();
        assert_eq!(err, "unknown report format 'html'; known: table, json, markdown, junit");
        let err = by_name::<ModelKind>("model", "resnet9", &["all"]).unwrap_err();
        assert_eq!(err, "unknown model 'resnet9'; known: linear, resnet18, resnet-tiny, tiny-lm, all");
    }
}
