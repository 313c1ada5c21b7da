//! A module for a future contract version, `wasmop:reconciler@0.2.0`; hosts serving 0.1.0 must
//! refuse it with an error naming both versions.

// wit-bindgen's generated export glue is `unsafe` (raw ABI functions).
#[cfg(target_family = "wasm")]
#[allow(unsafe_code)]
mod guest {
    wit_bindgen::generate!({
        inline: "
            package wasmop:reconciler@0.2.0;
            interface guest {
                metadata: func() -> string;
            }
            world module {
                export guest;
            }
        ",
    });

    struct Future;

    impl exports::wasmop::reconciler::guest::Guest for Future {
        fn metadata() -> String {
            "from the future".into()
        }
    }

    export!(Future);
}
