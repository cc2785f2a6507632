//! What the vectorised photometric kernels (`color`, `blur`, `affine`) share: conversions and
//! roundings that LLVM can put in SIMD lanes, and a dispatch to AVX2.
//!
//! The kernels compute, lane by lane, the same `f32` operations in the same order as the scalar
//! code they replaced (`reference`), so their bytes are identical (tested); what changes is
//! that nothing in their loops stops the vectoriser: no library call (`floor`, `%`,
//! `round_ties_even` are calls on x86-64's baseline SSE2), no saturating `as` conversion (a
//! branch per lane), branches written as selects, and one pixel's three bytes per iteration
//! (LLVM vectorises such stride-3 accesses with shuffles). Rust never fuses a multiply and an
//! add on its own, so the AVX2 copy computes the same values too.

/// `x` rounded half to even, for `0 <= x < 2^22` (every value the kernels round): adding
/// 2^23 leaves no fraction bits, so the addition rounds in the FPU's default mode (to nearest,
/// ties to even), and the subtraction is exact. `f32::round_ties_even` is a library call on
/// x86-64 without SSE4.1, which keeps its loop scalar.
#[inline(always)]
pub(crate) fn round_even(x: f32) -> f32 {
    const SHIFT: f32 = 8_388_608.0;
    (x + SHIFT) - SHIFT
}

/// `x.clamp(0.0, 255.0) as u8`, NaN giving 0 as there, without Rust's saturating float-to-int
/// conversion, which LLVM leaves scalar (a compare and branch per lane).
#[inline(always)]
pub(crate) fn to_u8(x: f32) -> u8 {
    // Written as selects: a NaN fails both comparisons and becomes 0.
    let x = if x > 0.0 { x } else { 0.0 };
    let x = if x < 255.0 { x } else { 255.0 };
    // SAFETY: `x` is in [0, 255], so it is finite and its truncation fits an i32.
    unsafe { x.to_int_unchecked::<i32>() as u8 }
}

/// `x.trunc()` for `|x| < 2^30` (the kernels' values are far inside; a NaN gives -2^30): one
/// conversion each way instead of a library call.
#[inline(always)]
pub(crate) fn trunc(x: f32) -> f32 {
    const LIMIT: f32 = 1_073_741_824.0;
    let x = if x > -LIMIT { x } else { -LIMIT };
    let x = if x < LIMIT { x } else { LIMIT };
    // SAFETY: `x` is in [-2^30, 2^30] (a NaN became -2^30 above), so its truncation fits an i32.
    (unsafe { x.to_int_unchecked::<i32>() }) as f32
}

/// `x - trunc(x)`, exact for `|x| < 2^23`: C's `fmod(x, 1.0)` (Rust's `x % 1.0`), which is a
/// library call.
#[inline(always)]
pub(crate) fn fmod1(x: f32) -> f32 {
    x - trunc(x)
}

#[cfg(test)]
thread_local! {
    /// Set inside [`on_baseline`].
    static BASELINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether [`dispatch`]ed kernels may take their AVX2 copy: always, except inside a test's
/// [`on_baseline`].
#[inline(always)]
pub(crate) fn avx2_allowed() -> bool {
    #[cfg(test)]
    if BASELINE.with(std::cell::Cell::get) {
        return false;
    }
    true
}

/// Runs `f` with the [`dispatch`]ed kernels on their baseline copy, so a test on an AVX2
/// machine checks both.
#[cfg(test)]
pub(crate) fn on_baseline<T>(f: impl FnOnce() -> T) -> T {
    BASELINE.with(|b| b.set(true));
    let out = f();
    BASELINE.with(|b| b.set(false));
    out
}

/// Defines a function whose body is compiled twice, for the build's target (x86-64's SSE2) and
/// for AVX2, and runs the AVX2 copy where the CPU has it. The body must be plain Rust (no
/// intrinsics): the two copies then compute the same values.
macro_rules! dispatch {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn imp($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    imp($($arg),*)
                }
                if crate::lanes::avx2_allowed() && std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2, checked on the line above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            imp($($arg),*)
        }
    };
}
pub(crate) use dispatch;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_even_is_round_ties_even_on_the_range() {
        // Every quarter and a few awkward values up to past 255.
        let mut x = 0.0f32;
        while x < 300.0 {
            assert_eq!(round_even(x), x.round_ties_even(), "{x}");
            x += 0.25;
        }
        for x in [0.5f32, 1.5, 2.5, 254.5, 255.49998, 0.49999997, 1e-30, 4_194_303.5] {
            assert_eq!(round_even(x), x.round_ties_even(), "{x}");
        }
    }

    #[test]
    fn fmod1_is_the_remainder() {
        for x in [0.0f32, 0.3, 0.99999994, 1.0, 1.8333334, -0.25, -0.99999994, -1.0, 5.5] {
            assert_eq!(fmod1(x), x % 1.0, "{x}");
        }
    }

    #[test]
    fn to_u8_and_trunc_are_the_casts() {
        for x in [
            -1e30f32,
            -3.5,
            -0.0,
            0.0,
            0.4,
            1.0,
            127.99,
            254.5,
            255.0,
            255.9,
            256.0,
            1e30,
            f32::NAN,
            f32::INFINITY,
        ] {
            assert_eq!(to_u8(x), x.clamp(0.0, 255.0) as u8, "{x}");
        }
        for x in [-1e6f32, -2.5, -0.99999994, 0.0, 0.5, 1.0, 5.999999, 6.0, 1e6] {
            assert_eq!(trunc(x), x.trunc(), "{x}");
        }
    }
}
