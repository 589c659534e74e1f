"""Row rendering: pgoutput's column text written straight as a format's bytes (JSON text, Avro binary),
skipping typed values where a column's text maps to its encoding cheaply. The package owns row rendering;
the serializers' ``row_rendering(table)`` call into it.
"""
