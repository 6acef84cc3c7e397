//! Our runs' tensors handed to the evidence: copied to the host, in their own dtype, as
//! [`Values`] (what traces hold and the judge reads, with no libtorch).

use tch::{Device, Kind, Tensor};

use crate::evidence::{Data, Elem, Params, Values};

/// A detached host copy of `t`, in its dtype (float32, float64, bfloat16, float16; integers
/// as int64).
pub fn host(t: &Tensor) -> Values {
    let t = t.detach().to_device(Device::Cpu).contiguous();
    let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
    let flat = t.reshape(-1);
    let bytes = |elem: Elem| {
        let mut buf = vec![0u8; flat.numel() * elem.size()];
        flat.copy_data_u8(&mut buf, flat.numel());
        Values::from_le_bytes(elem, shape.clone(), &buf)
    };
    match t.kind() {
        Kind::Float => Values::new(shape, Data::F32(Vec::<f32>::try_from(&flat).expect("float32 reads"))),
        Kind::Double => Values::new(shape, Data::F64(Vec::<f64>::try_from(&flat).expect("float64 reads"))),
        Kind::BFloat16 => bytes(Elem::Bf16),
        Kind::Half => bytes(Elem::F16),
        _ => Values::new(shape, Data::I64(Vec::<i64>::try_from(&flat.to_kind(Kind::Int64)).expect("int64 reads"))),
    }
}

/// Every element of `t` as float64, flattened, on the host.
pub fn f64s(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(&t.detach().to_device(Device::Cpu).to_kind(Kind::Double).reshape(-1)).expect("float64 reads")
}

/// A detached host copy of named tensors (parameters or their gradients).
pub fn snapshot<'a>(named: impl IntoIterator<Item = (&'a String, Tensor)>) -> Params {
    named.into_iter().map(|(n, t)| (n.clone(), host(&t))).collect()
}
