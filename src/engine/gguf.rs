//! The GGUF header, read and checked here before anything is allocated for
//! the weights: every length against the bytes left in the file, the
//! alignment, each tensor's type, shape and byte range (inside the file,
//! aligned, no two overlapping, no name twice). candle's reader keeps the
//! last of two same-named entries and divides by the alignment unchecked;
//! this one refuses both, with a message naming the key or tensor.

use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, TensorInfo, Value, VersionedMagic};
use candle_core::quantized::GgmlDType;

use crate::backend::BackendError;

/// Dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;
/// Arrays inside arrays, at most.
const MAX_DEPTH: usize = 4;
/// Alignment when `general.alignment` is absent.
const DEFAULT_ALIGNMENT: u64 = 32;

/// A GGUF type code's type (ggml.h), or None for one without a kernel type
/// in candle.
fn dtype(code: u32) -> Option<GgmlDType> {
    Some(match code {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        9 => GgmlDType::Q8_1,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        15 => GgmlDType::Q8K,
        30 => GgmlDType::BF16,
        _ => return None,
    })
}

struct Reader<'a> {
    inner: BufReader<&'a std::fs::File>,
    pos: u64,
    size: u64,
    v1: bool,
    path: &'a Path,
}

impl Reader<'_> {
    fn bad(&self, what: impl std::fmt::Display) -> BackendError {
        super::weights::corrupt(self.path, format!("not a readable GGUF file: {what}"))
    }

    fn left(&self) -> u64 {
        self.size.saturating_sub(self.pos)
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], BackendError> {
        let mut b = [0u8; N];
        if (N as u64) > self.left() {
            return Err(self.bad(format!("ends at byte {} inside the header", self.size)));
        }
        self.inner
            .read_exact(&mut b)
            .map_err(|e| super::weights::io_err(self.path, e))?;
        self.pos += N as u64;
        Ok(b)
    }

    fn u32(&mut self) -> Result<u32, BackendError> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> Result<u64, BackendError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    /// A length or count: u32 in GGUF v1, u64 after.
    fn len(&mut self) -> Result<u64, BackendError> {
        if self.v1 {
            self.u32().map(u64::from)
        } else {
            self.u64()
        }
    }

    /// A count of items of at least `min` bytes each, checked against the
    /// bytes left so that no count can ask for more memory than the file holds.
    fn count(&mut self, what: &str, min: u64) -> Result<usize, BackendError> {
        let n = self.len()?;
        if n.saturating_mul(min) > self.left() {
            return Err(self.bad(format!(
                "{what} {n} cannot fit in the {} bytes left",
                self.left()
            )));
        }
        usize::try_from(n).map_err(|_| self.bad(format!("{what} {n}")))
    }

    fn string(&mut self) -> Result<String, BackendError> {
        let n = self.count("string length", 1)?;
        let mut v = vec![0u8; n];
        self.inner
            .read_exact(&mut v)
            .map_err(|e| super::weights::io_err(self.path, e))?;
        self.pos += n as u64;
        // As candle reads them: some writers end strings with NULs, and a
        // few are not UTF-8.
        while v.last() == Some(&0) {
            v.pop();
        }
        Ok(String::from_utf8_lossy(&v).into_owned())
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<Value, BackendError> {
        Ok(match ty {
            0 => Value::U8(u8::from_le_bytes(self.bytes()?)),
            1 => Value::I8(i8::from_le_bytes(self.bytes()?)),
            2 => Value::U16(u16::from_le_bytes(self.bytes()?)),
            3 => Value::I16(i16::from_le_bytes(self.bytes()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.bytes()?)),
            6 => Value::F32(f32::from_le_bytes(self.bytes()?)),
            7 => match self.bytes::<1>()?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.bad(format!("boolean {b}"))),
            },
            8 => Value::String(self.string()?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(self.bad(format!("arrays nested deeper than {MAX_DEPTH}")));
                }
                let ty = self.u32()?;
                let min = match ty {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    10..=12 => 8,
                    _ if self.v1 => 4,
                    _ => 8,
                };
                let n = self.count("array length", min)?;
                let mut vs = Vec::with_capacity(n);
                for _ in 0..n {
                    vs.push(self.value(ty, depth + 1)?);
                }
                Value::Array(vs)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.bytes()?)),
            12 => Value::F64(f64::from_le_bytes(self.bytes()?)),
            t => return Err(self.bad(format!("value type {t}"))),
        })
    }
}

/// Reads and checks the header of the GGUF file `file` (at `path`).
pub fn read_header(path: &Path, file: &std::fs::File) -> Result<Content, BackendError> {
    let size = file
        .metadata()
        .map_err(|e| super::weights::io_err(path, e))?
        .len();
    let mut r = Reader {
        inner: BufReader::new(file),
        pos: 0,
        size,
        v1: false,
        path,
    };
    let magic = r.u32()?;
    if magic != 0x4655_4747 && magic != 0x4747_5546 {
        return Err(r.bad(format!("magic 0x{magic:08x}")));
    }
    let magic = match r.u32()? {
        1 => VersionedMagic::GgufV1,
        2 => VersionedMagic::GgufV2,
        3 => VersionedMagic::GgufV3,
        v => return Err(r.bad(format!("version {v}"))),
    };
    r.v1 = magic == VersionedMagic::GgufV1;
    let tensors = r.count("tensor count", 4 + 4 + 4 + 8)?;
    let kvs = r.count("metadata count", 4 + 4 + 1)?;
    let mut metadata = HashMap::with_capacity(kvs);
    for _ in 0..kvs {
        let key = r.string()?;
        let ty = r.u32()?;
        let value = r.value(ty, 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(r.bad(format!("metadata key {key} appears twice")));
        }
    }
    let mut infos: Vec<(String, TensorInfo)> = Vec::with_capacity(tensors);
    let mut seen = std::collections::HashSet::with_capacity(tensors);
    for _ in 0..tensors {
        let name = r.string()?;
        let n = r.u32()?;
        if n == 0 || n > MAX_DIMS {
            return Err(r.bad(format!("tensor {name} has {n} dimensions")));
        }
        let mut dims = Vec::with_capacity(n as usize);
        for _ in 0..n {
            dims.push(r.len()?);
        }
        let code = r.u32()?;
        let ty = dtype(code).ok_or_else(|| {
            super::weights::unsupported(path, format!("tensor {name} has GGML type {code}"))
        })?;
        let offset = r.u64()?;
        let bad = |what: String| super::weights::corrupt(path, format!("tensor {name}: {what}"));
        // Sizes are computed from the dimensions below: their product must
        // not wrap.
        if dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d).filter(|_| d > 0))
            .is_none()
        {
            return Err(bad(format!(
                "dimensions {dims:?} (zero, or a product past 2^64)"
            )));
        }
        if !dims[0].is_multiple_of(ty.block_size() as u64) {
            return Err(bad(format!(
                "rows of {} values do not fill {ty:?} blocks of {}",
                dims[0],
                ty.block_size()
            )));
        }
        let dims: Vec<usize> = dims
            .iter()
            .rev()
            .map(|&d| usize::try_from(d))
            .collect::<Result<_, _>>()
            .map_err(|_| bad(format!("dimensions {dims:?}")))?;
        if !seen.insert(name.clone()) {
            return Err(bad("listed twice".into()));
        }
        infos.push((
            name,
            TensorInfo {
                ggml_dtype: ty,
                shape: candle_core::Shape::from(dims),
                offset,
            },
        ));
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U8(v)) => u64::from(*v),
        Some(Value::U16(v)) => u64::from(*v),
        Some(Value::U32(v)) => u64::from(*v),
        Some(Value::U64(v)) => *v,
        Some(Value::I32(v)) => u64::try_from(*v).unwrap_or(0),
        Some(other) => {
            return Err(r.bad(format!("metadata general.alignment is {other:?}")));
        }
    };
    if !alignment.is_power_of_two() {
        return Err(r.bad(format!(
            "metadata general.alignment is {alignment}, not a power of two"
        )));
    }
    let data = r.pos.div_ceil(alignment) * alignment;
    let mut ranges: Vec<(u64, u64, &str)> = Vec::with_capacity(infos.len());
    for (name, info) in &infos {
        let bad = |what: String| super::weights::corrupt(path, format!("tensor {name}: {what}"));
        let ty = info.ggml_dtype;
        let elements = info.shape.elem_count() as u64;
        let bytes = (elements / ty.block_size() as u64)
            .checked_mul(ty.type_size() as u64)
            .ok_or_else(|| bad(format!("{elements} values of {ty:?}")))?;
        if !info.offset.is_multiple_of(alignment) {
            return Err(bad(format!(
                "offset {} is not a multiple of the alignment {alignment}",
                info.offset
            )));
        }
        let start = data.checked_add(info.offset);
        let end = start.and_then(|s| s.checked_add(bytes));
        match (start, end) {
            (Some(s), Some(e)) if e <= size => ranges.push((s, e, name)),
            _ => {
                return Err(bad(format!(
                    "needs {bytes} bytes from offset {} past the header, but the file has {size} (truncated download?)",
                    info.offset
                )))
            }
        }
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(super::weights::corrupt(
                path,
                format!(
                    "tensors {} and {} share bytes {}..{}",
                    w[0].2,
                    w[1].2,
                    w[1].0,
                    w[0].1.min(w[1].1)
                ),
            ));
        }
    }
    Ok(Content {
        magic,
        metadata,
        tensor_infos: infos.into_iter().collect(),
        tensor_data_offset: data,
    })
}
