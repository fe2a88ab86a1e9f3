//! One document, read by the parser's visitor as it goes: a `List`'s items (or a JSON
//! array's elements) are converted one by one, each held as a value only while it is read.

use std::fmt;

use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::Position;
use super::loader::{Loader, Read};
use crate::convert::ConvertOptions;

/// Reads one document into a [`Loader`].
pub(super) struct DocumentSeed<'a, 'o> {
    /// Where the objects go.
    pub loader: &'a mut Loader<'o>,
    /// The document's position.
    pub position: Position,
}

impl<'de> DeserializeSeed<'de> for DocumentSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl DocumentSeed<'_, '_> {
    fn not_an_object(self) {
        let reason = "not a Kubernetes object (expected a mapping)";
        self.loader.document_failed(self.position.error(None, None, reason));
    }
}

impl<'de> Visitor<'de> for DocumentSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object, a List of them, or an array of them")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.not_an_object();
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.not_an_object();
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.not_an_object();
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.not_an_object();
        Ok(())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.not_an_object();
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        let read = read_items(seq, self.loader.options, self.position)?.0;
        self.loader.commit(read, false);
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let options = self.loader.options;
        let mut fields = serde_json::Map::new();
        let mut items = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "items" {
                match map.next_value_seed(ItemsSeed { options, position: self.position })? {
                    Items::Read(read, count) => items = Some((read, count)),
                    Items::Other(value) => {
                        fields.insert(key, value);
                    }
                }
            } else {
                fields.insert(key, map.next_value::<Value>()?);
            }
        }
        let kind = fields.get("kind").and_then(Value::as_str);
        match items {
            Some((read, count)) if kind.is_some_and(|k| k.ends_with("List")) => {
                self.loader.commit(read, count == 0);
            }
            _ => {
                // Not a List: the document is one object (an `items` field of another
                // kind is not one kpng reads).
                let mut read = Read::default();
                read.object(options, self.position, &Value::Object(fields));
                self.loader.commit(read, false);
            }
        }
        Ok(())
    }
}

/// The `items` of a document: read one by one when they are a sequence.
struct ItemsSeed<'o> {
    options: &'o ConvertOptions,
    position: Position,
}

/// What an `items` field held.
enum Items {
    /// A sequence, read: the results and the number of items.
    Read(Read, usize),
    /// Anything else, kept as a value.
    Other(Value),
}

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_> {
    type Value = Items;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Items, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed<'_> {
    type Value = Items;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of Kubernetes objects")
    }

    // `items: null` is not an empty list: a truncated `kubectl get -o yaml` ends so.
    fn visit_unit<E: de::Error>(self) -> Result<Items, E> {
        Ok(Items::Other(Value::Null))
    }

    fn visit_none<E: de::Error>(self) -> Result<Items, E> {
        Ok(Items::Other(Value::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Items, A::Error> {
        let (read, count) = read_items(seq, self.options, self.position)?;
        Ok(Items::Read(read, count))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Items, A::Error> {
        Value::deserialize(MapAccessDeserializer::new(map)).map(Items::Other)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Items, E> {
        Ok(Items::Other(Value::from(v)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Items, E> {
        Ok(Items::Other(Value::from(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Items, E> {
        Ok(Items::Other(Value::from(v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Items, E> {
        Ok(Items::Other(Value::from(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Items, E> {
        Ok(Items::Other(Value::from(v)))
    }
}

/// Reads the elements of a sequence as objects, one at a time.
fn read_items<'de, A: SeqAccess<'de>>(
    mut seq: A,
    options: &ConvertOptions,
    position: Position,
) -> Result<(Read, usize), A::Error> {
    let mut read = Read::default();
    let mut count = 0;
    while let Some(value) = seq.next_element::<Value>()? {
        read.object(options, Position { item: Some(count), ..position }, &value);
        count += 1;
    }
    Ok((read, count))
}
