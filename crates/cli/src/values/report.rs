//! The report formats (`--report`).

values! {
    pub enum Format {
        /// the verdict and every comparison, for people
        Table = "table",
        /// everything, for machines (schema in the README)
        Json = "json",
        /// a summary for a pull request or a CI job page
        #[value(alias = "md")]
        Markdown = "markdown",
        /// one test case per comparison, for CI test reports
        Junit = "junit",
    }
}
