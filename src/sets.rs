//! Config sets embedded in the binary, so the main job runs on a machine that has only the
//! binary. Each set is one figure of a paper; the files are the ones under `configs/`.

/// A config file compiled into the binary.
pub struct EmbeddedConfig {
    /// Path relative to the repository's `configs/`.
    pub path: &'static str,
    pub yaml: &'static str,
}

/// A named set of configs that together make one figure.
pub struct ConfigSet {
    pub name: &'static str,
    pub about: &'static str,
    pub configs: &'static [EmbeddedConfig],
}

macro_rules! embed {
    ($($p:literal),* $(,)?) => {
        &[$(EmbeddedConfig { path: $p, yaml: include_str!(concat!("../configs/", $p)) }),*]
    };
}

pub const SETS: &[ConfigSet] = &[
    ConfigSet {
        name: "showcase",
        about: "MLP-Mixer on Fashion-MNIST: residual vs ACN vs H-ACN, trained, analysed and plotted",
        configs: embed!("showcase/res.yaml", "showcase/acn.yaml", "showcase/hacn.yaml"),
    },
    ConfigSet {
        name: "lnn-fig2a",
        about: "ANCRe Fig. 2a: deep linear networks of depth 2, 3, 4 without shortcuts",
        configs: embed!("lnn/fig2a/1-k2.yaml", "lnn/fig2a/2-k3.yaml", "lnn/fig2a/3-k4.yaml"),
    },
    ConfigSet {
        name: "lnn-fig2b",
        about: "ANCRe Fig. 2b: K=3 with no shortcut, cascaded, 0:1, 0:2 and ANCRe",
        configs: embed!(
            "lnn/fig2b/1-none.yaml",
            "lnn/fig2b/2-cascaded.yaml",
            "lnn/fig2b/3-0to1.yaml",
            "lnn/fig2b/4-0to2.yaml",
            "lnn/fig2b/5-ancre.yaml",
        ),
    },
    ConfigSet {
        name: "lnn-fig2c",
        about: "ANCRe Fig. 2c: K=4 shortcut layouts, one and two shortcuts, and ANCRe",
        configs: embed!(
            "lnn/fig2c/1-none.yaml",
            "lnn/fig2c/2-cascaded.yaml",
            "lnn/fig2c/3-0to3.yaml",
            "lnn/fig2c/4-0to1-0to3.yaml",
            "lnn/fig2c/5-1to2-2to3.yaml",
            "lnn/fig2c/6-0to2-1to3.yaml",
            "lnn/fig2c/7-ancre.yaml",
        ),
    },
];

/// The embedded config set called `name`, if there is one.
pub fn find(name: &str) -> Option<&'static ConfigSet> {
    SETS.iter().find(|s| s.name == name)
}
