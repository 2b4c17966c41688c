"""The schema readers of this project's own targets, one module each (named by each target's record,
`Target.schema`). What a reader is: `targetkit.schema.SchemaReader`."""
