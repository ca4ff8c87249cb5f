//! A JSON file read one object at a time.
//!
//! `kubectl get … -o json` writes a `List` whose `items` come before its
//! `kind`, so a list cannot be recognised before its items are read. Each
//! item is therefore added to the inventory as soon as it is parsed (only
//! one object's `Value` is alive at a time), and undone if the document
//! turns out not to be a list after all; what [`super::Inventory::add_value`]
//! would have done with the whole tree is what happens, in the same order.
//!
//! A ResourceSlice item whose `kind` comes before its `spec` (kubectl's and
//! our drivers' order) skips the `Value` too: its spec is read straight
//! into the typed form, which halves the time a 1,000-node dump takes to
//! read. Should that fail, the file is read again the plain way, which
//! reports the error as it always has.

use std::fmt;
use std::path::Path;

use k8s_openapi::api::resource::v1::{ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize as _;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::{Inventory, InventoryError};

/// What reading a text as JSON came to.
pub(super) enum Read {
    /// JSON: its objects are added, or the first that could not be.
    Json(Result<(), InventoryError>),
    /// Not JSON; nothing is left added.
    NotJson,
    /// A slice did not read straight into its typed form: read the text
    /// as one `Value` (nothing is left added).
    Again,
}

/// Adds the objects of `text` if it is JSON.
pub(super) fn add_json(inventory: &mut Inventory, path: &Path, text: &str) -> Read {
    let mut de = serde_json::Deserializer::from_str(text);
    let mut reader = Reader {
        inventory,
        path,
        failed: None,
        typed_failed: false,
    };
    let read = (&mut reader).deserialize(&mut de).and_then(|()| de.end());
    match (read, reader.failed) {
        (Err(_), _) if reader.typed_failed => Read::Again,
        (Err(_), _) => Read::NotJson,
        (Ok(()), Some(e)) => Read::Json(Err(e)),
        (Ok(()), None) => Read::Json(Ok(())),
    }
}

struct Reader<'r> {
    inventory: &'r mut Inventory,
    path: &'r Path,
    /// The first object that could not be added; the rest are skipped.
    failed: Option<InventoryError>,
    /// A slice's spec or metadata did not read into its typed form.
    typed_failed: bool,
}

impl Reader<'_> {
    fn add_item(&mut self, item: Item) {
        match item {
            Item::Slice(slice) => {
                if self.failed.is_none() {
                    self.inventory.add_slice(&slice);
                }
            }
            Item::Value(value) => self.add(value),
        }
    }

    fn add(&mut self, value: Value) {
        if self.failed.is_none()
            && let Err(e) = self.inventory.add_value(self.path, value)
        {
            self.failed = Some(e);
        }
    }
}

impl<'de> DeserializeSeed<'de> for &mut Reader<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for &mut Reader<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a Kubernetes object or list")
    }

    /// `null`: nothing, as an empty YAML document.
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    // Anything but an object has no kind: ignored.
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        self.inventory.ignored += 1;
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        self.inventory.ignored += 1;
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        self.inventory.ignored += 1;
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        self.inventory.ignored += 1;
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        self.inventory.ignored += 1;
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        self.inventory.ignored += 1;
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let before = self.inventory.mark();
        let mut rest = Map::new();
        let mut items = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "items" && items.is_none() {
                let mut list = Items {
                    reader: &mut *self,
                    waiting: None,
                    non_array: None,
                };
                map.next_value_seed(&mut list)?;
                items = Some((list.waiting, list.non_array));
            } else {
                let value: Value = map.next_value()?;
                rest.insert(key, value);
            }
        }
        let kind = rest
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        match items {
            Some((waiting, None)) if kind.ends_with("List") => {
                // A list: its items are in; those after a kind-less one waited
                // for the list's kind.
                let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
                for mut item in waiting.unwrap_or_default() {
                    if let (Some(k), Item::Value(Value::Object(obj))) = (item_kind, &mut item) {
                        obj.entry("kind")
                            .or_insert_with(|| Value::String(k.to_string()));
                    }
                    self.add_item(item);
                }
            }
            items => {
                // One object that happens to have `items`: what was added
                // from them goes, and the object is read as a whole (its
                // `items` meant nothing to any kind read here, unless they
                // were not a list).
                self.inventory.rewind(before);
                self.failed = None;
                if let Some((_, Some(non_array))) = items {
                    rest.insert("items".to_string(), non_array);
                }
                self.add(Value::Object(rest));
            }
        }
        Ok(())
    }
}

/// The `items` of a document.
struct Items<'a, 'r> {
    reader: &'a mut Reader<'r>,
    /// From the first item without a kind on: the items, in order, until
    /// the list's kind is known.
    waiting: Option<Vec<Item>>,
    /// `items` was not an array: its value.
    non_array: Option<Value>,
}

impl<'de> DeserializeSeed<'de> for &mut Items<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl Items<'_, '_> {
    fn not_array<E>(&mut self, value: Value) -> Result<(), E> {
        self.non_array = Some(value);
        Ok(())
    }
}

impl<'de> Visitor<'de> for &mut Items<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list's items")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        loop {
            if self.reader.failed.is_some() {
                // The file will be refused: skip the rest unparsed.
                if seq.next_element::<IgnoredAny>()?.is_none() {
                    return Ok(());
                }
                continue;
            }
            let seed = ItemSeed {
                typed_failed: &mut self.reader.typed_failed,
            };
            let Some(item) = seq.next_element_seed(seed)? else {
                return Ok(());
            };
            let has_kind = match &item {
                Item::Slice(_) => true,
                Item::Value(v) => v.get("kind").is_some_and(Value::is_string),
            };
            match &mut self.waiting {
                Some(waiting) => waiting.push(item),
                None if !has_kind => self.waiting = Some(vec![item]),
                None => self.reader.add_item(item),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        let value = Value::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
        self.not_array(value)
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        self.not_array(Value::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.not_array(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        self.not_array(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        self.not_array(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        self.not_array(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        self.not_array(Value::String(v.to_string()))
    }
}

/// One item of a list.
enum Item {
    /// A ResourceSlice of `resource.k8s.io/v1`, read straight into its type.
    Slice(Box<ResourceSlice>),
    Value(Value),
}

struct ItemSeed<'a> {
    typed_failed: &'a mut bool,
}

impl<'de> DeserializeSeed<'de> for ItemSeed<'_> {
    type Value = Item;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Item, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl ItemSeed<'_> {
    fn refuse<E: serde::de::Error>(self, why: impl fmt::Display) -> E {
        *self.typed_failed = true;
        E::custom(why)
    }
}

impl<'de> Visitor<'de> for ItemSeed<'_> {
    type Value = Item;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Item, A::Error> {
        let mut fields = Map::new();
        let mut spec: Option<ResourceSliceSpec> = None;
        while let Some(key) = map.next_key::<String>()? {
            let is_slice = fields.get("kind").and_then(Value::as_str) == Some("ResourceSlice");
            if key == "spec" && is_slice && spec.is_none() {
                match map.next_value::<ResourceSliceSpec>() {
                    Ok(s) => spec = Some(s),
                    Err(e) => return Err(self.refuse(e)),
                }
            } else {
                let value: Value = map.next_value()?;
                fields.insert(key, value);
            }
        }
        let Some(spec) = spec else {
            return Ok(Item::Value(Value::Object(fields)));
        };
        let api_version = fields
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let kind = fields.get("kind").and_then(Value::as_str);
        if !(api_version.is_empty() || api_version == "resource.k8s.io/v1")
            || kind != Some("ResourceSlice")
        {
            return Err(self.refuse("not a resource.k8s.io/v1 ResourceSlice"));
        }
        let metadata = match fields.remove("metadata") {
            None => ObjectMeta::default(),
            Some(m) => match serde_json::from_value::<ObjectMeta>(m) {
                Ok(m) => m,
                Err(e) => return Err(self.refuse(e)),
            },
        };
        Ok(Item::Slice(Box::new(ResourceSlice { metadata, spec })))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Item, A::Error> {
        Value::deserialize(serde::de::value::SeqAccessDeserializer::new(seq)).map(Item::Value)
    }
    fn visit_unit<E>(self) -> Result<Item, E> {
        Ok(Item::Value(Value::Null))
    }
    fn visit_bool<E>(self, v: bool) -> Result<Item, E> {
        Ok(Item::Value(Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Item, E> {
        Ok(Item::Value(Value::from(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Item, E> {
        Ok(Item::Value(Value::from(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Item, E> {
        Ok(Item::Value(Value::from(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Item, E> {
        Ok(Item::Value(Value::String(v.to_string())))
    }
}
