//! A tensor as the evidence holds it: a shape and its elements in the dtype they were
//! recorded in, on the host, with no libtorch. Traces are read into these, and the judge
//! reads them; our own runs hand theirs over in the same form (`train::host`), so one
//! judgement serves the binary that trains and the one that only judges.

use std::sync::Arc;

use half::{bf16, f16};
use memmap2::Mmap;

/// The elements, in their own dtype (a float32 trace costs 4 bytes an element, not 8).
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
    I64(Vec<i64>),
    /// Still in the trace file, mapped: read as the judge goes, and given back to the file
    /// ([`Values::release`]) once a step is judged, so `compare` holds about one step.
    Mapped(Mapped),
}

/// A tensor's bytes in a mapped trace file.
#[derive(Debug, Clone)]
pub struct Mapped {
    pub map: Arc<Mmap>,
    pub start: usize,
    pub len: usize,
    pub elem: Elem,
}

impl PartialEq for Mapped {
    fn eq(&self, other: &Self) -> bool {
        self.elem == other.elem && self.bytes() == other.bytes()
    }
}

impl Mapped {
    fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }
}

/// Elements of `elem` from little-endian bytes into float64.
fn decode(elem: Elem, b: &[u8], out: &mut [f64]) {
    fn each<const N: usize>(b: &[u8], out: &mut [f64], f: impl Fn([u8; N]) -> f64) {
        out.iter_mut().zip(b.chunks_exact(N)).for_each(|(o, c)| *o = f(c.try_into().expect("chunks of N")));
    }
    match elem {
        Elem::F32 => each(b, out, |c| f64::from(f32::from_le_bytes(c))),
        Elem::F64 => each(b, out, f64::from_le_bytes),
        Elem::Bf16 => each(b, out, |c| f64::from(bf16::from_le_bytes(c))),
        Elem::F16 => each(b, out, |c| f64::from(f16::from_le_bytes(c))),
        Elem::I64 => each(b, out, |c| i64::from_le_bytes(c) as f64),
    }
}

/// A shape and its elements, row-major. Cloning shares the elements, as a tensor's
/// shallow clone does.
#[derive(Debug, Clone, PartialEq)]
pub struct Values {
    shape: Vec<usize>,
    data: Arc<Data>,
}

/// The element types, by safetensors' names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    F32,
    F64,
    Bf16,
    F16,
    I64,
}

impl Elem {
    /// Safetensors' name.
    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "F32",
            Elem::F64 => "F64",
            Elem::Bf16 => "BF16",
            Elem::F16 => "F16",
            Elem::I64 => "I64",
        }
    }

    pub fn size(self) -> usize {
        match self {
            Elem::F32 => 4,
            Elem::F64 | Elem::I64 => 8,
            Elem::Bf16 | Elem::F16 => 2,
        }
    }
}

impl Values {
    pub fn new(shape: Vec<usize>, data: Data) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data_len(&data), "shape and elements agree");
        Values { shape, data: Arc::new(data) }
    }

    /// A flat float32 tensor.
    pub fn f32s(v: Vec<f32>) -> Self {
        Values::new(vec![v.len()], Data::F32(v))
    }

    /// A flat float64 tensor.
    pub fn f64s(v: Vec<f64>) -> Self {
        Values::new(vec![v.len()], Data::F64(v))
    }

    /// `v` stored as `elem` in `shape` (rounded to it, as a cast does).
    pub fn from_f64_as(elem: Elem, shape: &[usize], v: Vec<f64>) -> Self {
        let data = match elem {
            Elem::F32 => Data::F32(v.iter().map(|x| *x as f32).collect()),
            Elem::F64 => Data::F64(v),
            Elem::Bf16 => Data::Bf16(v.iter().map(|x| bf16::from_f64(*x)).collect()),
            Elem::F16 => Data::F16(v.iter().map(|x| f16::from_f64(*x)).collect()),
            Elem::I64 => Data::I64(v.iter().map(|x| *x as i64).collect()),
        };
        Values::new(shape.to_vec(), data)
    }

    /// A flat int64 tensor.
    pub fn i64s(v: Vec<i64>) -> Self {
        Values::new(vec![v.len()], Data::I64(v))
    }

    /// `f64s` in `shape`.
    pub fn f64s_shaped(shape: &[usize], v: Vec<f64>) -> Self {
        Values::new(shape.to_vec(), Data::F64(v))
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The shape as torch gives it (`Tensor::size`).
    pub fn size(&self) -> Vec<i64> {
        self.shape.iter().map(|&d| d as i64).collect()
    }

    pub fn data(&self) -> &Data {
        &self.data
    }

    pub fn numel(&self) -> usize {
        data_len(&self.data)
    }

    /// The float dtype, by `--dtype`'s names; None for integers.
    pub fn dtype(&self) -> Option<crate::spec::Dtype> {
        use crate::spec::Dtype;
        match self.elem() {
            Elem::F32 => Some(Dtype::Float32),
            Elem::F64 => Some(Dtype::Float64),
            Elem::Bf16 => Some(Dtype::Bfloat16),
            Elem::F16 => Some(Dtype::Float16),
            Elem::I64 => None,
        }
    }

    pub fn elem(&self) -> Elem {
        match &*self.data {
            Data::F32(_) => Elem::F32,
            Data::F64(_) => Elem::F64,
            Data::Bf16(_) => Elem::Bf16,
            Data::F16(_) => Elem::F16,
            Data::I64(_) => Elem::I64,
            Data::Mapped(m) => m.elem,
        }
    }

    /// Element `i` (flat index) as float64.
    pub fn get(&self, i: usize) -> f64 {
        match &*self.data {
            Data::F32(v) => f64::from(v[i]),
            Data::F64(v) => v[i],
            Data::Bf16(v) => f64::from(v[i]),
            Data::F16(v) => f64::from(v[i]),
            Data::I64(v) => v[i] as f64,
            Data::Mapped(m) => {
                let mut out = [0.0];
                let n = m.elem.size();
                decode(m.elem, &m.bytes()[i * n..(i + 1) * n], &mut out);
                out[0]
            }
        }
    }

    /// Elements `start..start + out.len()` as float64, in one tight loop per dtype.
    pub fn read_f64(&self, start: usize, out: &mut [f64]) {
        let end = start + out.len();
        match &*self.data {
            Data::F32(v) => out.iter_mut().zip(&v[start..end]).for_each(|(o, x)| *o = f64::from(*x)),
            Data::F64(v) => out.copy_from_slice(&v[start..end]),
            Data::Bf16(v) => out.iter_mut().zip(&v[start..end]).for_each(|(o, x)| *o = f64::from(*x)),
            Data::F16(v) => out.iter_mut().zip(&v[start..end]).for_each(|(o, x)| *o = f64::from(*x)),
            Data::I64(v) => out.iter_mut().zip(&v[start..end]).for_each(|(o, x)| *o = *x as f64),
            Data::Mapped(m) => {
                let n = m.elem.size();
                decode(m.elem, &m.bytes()[start * n..end * n], out);
            }
        }
    }

    /// Every element as float64, flattened.
    pub fn to_f64(&self) -> Vec<f64> {
        let mut out = vec![0.0; self.numel()];
        self.read_f64(0, &mut out);
        out
    }

    /// Every element as int64 (counters), flattened.
    pub fn to_i64(&self) -> Vec<i64> {
        match &*self.data {
            Data::I64(v) => v.clone(),
            Data::Mapped(m) if m.elem == Elem::I64 => {
                m.bytes().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
            }
            _ => self.to_f64().into_iter().map(|x| x as i64).collect(),
        }
    }

    /// The largest |element| (0 when empty; NaN propagates).
    pub fn abs_max(&self) -> f64 {
        let mut m = 0.0f64;
        let mut buf = [0.0; CHUNK];
        for start in (0..self.numel()).step_by(CHUNK) {
            let n = CHUNK.min(self.numel() - start);
            self.read_f64(start, &mut buf[..n]);
            for x in &buf[..n] {
                let a = x.abs();
                if a > m || a.is_nan() {
                    m = a;
                }
            }
        }
        m
    }

    /// Whether every element is finite.
    pub fn all_finite(&self) -> bool {
        if let Data::Mapped(_) = &*self.data {
            let mut buf = [0.0; CHUNK];
            return (0..self.numel()).step_by(CHUNK).all(|start| {
                let n = CHUNK.min(self.numel() - start);
                self.read_f64(start, &mut buf[..n]);
                buf[..n].iter().all(|x| x.is_finite())
            });
        }
        match &*self.data {
            Data::F32(v) => v.iter().all(|x| x.is_finite()),
            Data::F64(v) => v.iter().all(|x| x.is_finite()),
            Data::Bf16(v) => v.iter().all(|x| x.is_finite()),
            Data::F16(v) => v.iter().all(|x| x.is_finite()),
            Data::I64(_) | Data::Mapped(_) => true,
        }
    }

    /// The elements as little-endian bytes, as safetensors stores them.
    pub fn le_bytes(&self) -> Vec<u8> {
        fn bytes<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
            v.iter().flat_map(|x| f(*x)).collect()
        }
        match &*self.data {
            Data::F32(v) => bytes(v, f32::to_le_bytes),
            Data::F64(v) => bytes(v, f64::to_le_bytes),
            Data::Bf16(v) => bytes(v, bf16::to_le_bytes),
            Data::F16(v) => bytes(v, f16::to_le_bytes),
            Data::I64(v) => bytes(v, i64::to_le_bytes),
            Data::Mapped(m) => m.bytes().to_vec(),
        }
    }

    /// Elements of type `elem` from little-endian bytes (a safetensors tensor's data).
    pub fn from_le_bytes(elem: Elem, shape: Vec<usize>, b: &[u8]) -> Self {
        fn read<T, const N: usize>(b: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
            b.chunks_exact(N).map(|c| f(c.try_into().expect("chunks of N"))).collect()
        }
        let data = match elem {
            Elem::F32 => Data::F32(read(b, f32::from_le_bytes)),
            Elem::F64 => Data::F64(read(b, f64::from_le_bytes)),
            Elem::Bf16 => Data::Bf16(read(b, bf16::from_le_bytes)),
            Elem::F16 => Data::F16(read(b, f16::from_le_bytes)),
            Elem::I64 => Data::I64(read(b, i64::from_le_bytes)),
        };
        Values::new(shape, data)
    }

    /// The same elements as one flat dimension.
    pub fn flatten(&self) -> Values {
        Values { shape: vec![self.numel()], data: self.data.clone() }
    }

    /// A mapped tensor from `len` bytes at `start` of `map`.
    pub fn mapped(map: Arc<Mmap>, start: usize, len: usize, elem: Elem, shape: Vec<usize>) -> Self {
        Values::new(shape, Data::Mapped(Mapped { map, start, len, elem }))
    }

    /// Gives a mapped tensor's pages back to the file (they are read again if used again):
    /// what keeps `compare`'s memory at about one step. Nothing for tensors in memory.
    pub fn release(&self) {
        let Data::Mapped(m) = &*self.data else { return };
        let page = 4096;
        let base = m.map.as_ptr() as usize;
        // Whole pages inside the tensor; its neighbours' pages are never dropped early.
        let (lo, hi) = ((base + m.start).div_ceil(page) * page, (base + m.start + m.len) / page * page);
        if hi > lo {
            // SAFETY: the range lies inside this read-only private file mapping, which stays
            // mapped (the Arc); MADV_DONTNEED on it only drops clean pages that the kernel
            // reads back from the unchanged file on the next access.
            unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_DONTNEED) };
        }
    }

    /// At most `k` elements, flattened, at evenly strided positions `i * numel / k` (the
    /// positions `fixtures/resnet_reference.py` keeps). Tensors of `k` elements or fewer are
    /// kept whole, so sampling twice changes nothing.
    pub fn sample(&self, k: usize) -> Values {
        let n = self.numel();
        if n <= k {
            return self.flatten();
        }
        self.gather(&(0..k).map(|i| i * n / k).collect::<Vec<_>>())
    }

    /// The elements at `positions` of the flattened tensor, in its dtype (a sampled trace's
    /// kept elements).
    pub fn gather(&self, positions: &[usize]) -> Values {
        // Through float64, which holds every value of these dtypes exactly.
        Values::from_f64_as(self.elem(), &[positions.len()], positions.iter().map(|&k| self.get(k)).collect())
    }

    /// Bytes its elements take.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.elem().size()
    }
}

/// Elements converted per pass in the judge's loops: small enough to stay in cache.
pub const CHUNK: usize = 4096;

fn data_len(d: &Data) -> usize {
    match d {
        Data::Mapped(m) => m.len / m.elem.size(),
        Data::F32(v) => v.len(),
        Data::F64(v) => v.len(),
        Data::Bf16(v) => v.len(),
        Data::F16(v) => v.len(),
        Data::I64(v) => v.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_in_every_dtype() {
        let x = [1.5f64, -0.25, 3.0];
        let all = [
            Values::f32s(x.iter().map(|v| *v as f32).collect()),
            Values::f64s(x.to_vec()),
            Values::new(vec![3], Data::Bf16(x.iter().map(|v| bf16::from_f64(*v)).collect())),
            Values::new(vec![3], Data::F16(x.iter().map(|v| f16::from_f64(*v)).collect())),
        ];
        for v in all {
            let back = Values::from_le_bytes(v.elem(), vec![3], &v.le_bytes());
            assert_eq!(back, v);
            assert_eq!(back.to_f64(), x);
        }
    }

    #[test]
    fn sampling_keeps_small_tensors_and_strides_large_ones() {
        let v = Values::f64s((0..10).map(f64::from).collect());
        assert_eq!(v.sample(20).to_f64().len(), 10);
        assert_eq!(v.sample(4).to_f64(), [0.0, 2.0, 5.0, 7.0]);
        assert_eq!(v.sample(4).sample(4), v.sample(4));
    }

    #[test]
    fn abs_max_sees_nan_and_the_largest_magnitude() {
        assert_eq!(Values::f32s(vec![1.0, -3.0, 2.0]).abs_max(), 3.0);
        assert!(Values::f32s(vec![1.0, f32::NAN]).abs_max().is_nan());
        assert_eq!(Values::f32s(vec![]).abs_max(), 0.0);
    }
}
